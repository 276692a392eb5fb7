// services/common/check.h: a failed STAGEWISE_BUG logs and counts (tests run
// Release builds, where it does not abort); ThreadChecker tells its owner.
#include "services/common/check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "services/common/log.h"

namespace stagewise {
namespace {

std::vector<std::string>* captured = nullptr;
void Capture(absl::string_view line) {
  if (captured != nullptr) captured->emplace_back(line);
}

TEST(Check, ABugLogsWithItsContextAndCounts) {
#ifndef NDEBUG
  GTEST_SKIP() << "debug builds abort on a failed STAGEWISE_BUG";
#endif
  std::vector<std::string> lines;
  captured = &lines;
  log::SetSinkForTesting(&Capture);
  const int64_t before = BugCount();
  int evaluated = 0;
  STAGEWISE_BUG(++evaluated == 1) << "never shown";
  EXPECT_EQ(BugCount(), before);
  const int loop_thread = 7;
  STAGEWISE_BUG(loop_thread == 8) << "called off the loop thread (" << loop_thread << ")";
  EXPECT_EQ(BugCount(), before + 1);
  log::SetSinkForTesting(nullptr);
  captured = nullptr;
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], ::testing::HasSubstr("check_test.cc"));
  EXPECT_THAT(lines[0],
              ::testing::HasSubstr("BUG: loop_thread == 8 failed: called off the loop thread (7)"));
  // A DCHECK's condition is not evaluated in release builds.
  STAGEWISE_DCHECK(++evaluated > 100);
  EXPECT_EQ(evaluated, 1);
}

TEST(Check, AThreadCheckerKnowsItsOwner) {
  ThreadChecker checker;
  bool elsewhere = false;
  EXPECT_TRUE(checker.OnOwner());  // unbound: anyone
  checker.Bind();
  EXPECT_TRUE(checker.OnOwner());
  std::thread([&] { elsewhere = checker.OnOwner(); }).join();
  EXPECT_FALSE(elsewhere);
  std::thread([&] {
    checker.Bind();
    elsewhere = checker.OnOwner();
  }).join();
  EXPECT_TRUE(elsewhere);
  EXPECT_FALSE(checker.OnOwner());
}

}  // namespace
}  // namespace stagewise
