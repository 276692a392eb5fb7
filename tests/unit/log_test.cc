// The shared logger (services/common/log.h) and status macros
// (services/common/status_macros.h).
#include "services/common/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/common/status_macros.h"

namespace stagewise {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

std::vector<std::string>& Captured() {
  static std::vector<std::string> lines;
  return lines;
}

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Captured().clear();
    saved_ = log::GetLogLevel();
    log::SetSinkForTesting([](absl::string_view line) { Captured().emplace_back(line); });
  }
  void TearDown() override {
    log::SetSinkForTesting(nullptr);
    log::SetLogLevel(saved_);
  }
  log::Level saved_ = log::Level::kInfo;
};

TEST_F(LogTest, LineHasSeverityTimeFileAndMessage) {
  log::SetLogLevel(log::Level::kInfo);
  STAGEWISE_LOG(WARNING) << "lost worker " << 7;
  ASSERT_EQ(Captured().size(), 1u);
  EXPECT_THAT(
      Captured()[0],
      MatchesRegex("W[0-9]{8} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6} log_test\\.cc:[0-9]+\\] "
                   "lost worker 7\n"));
}

TEST_F(LogTest, LinesBelowTheLevelAreNotEvaluated) {
  log::SetLogLevel(log::Level::kWarning);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  STAGEWISE_LOG(INFO) << "hidden " << count();
  STAGEWISE_LOG(DEBUG) << "hidden " << count();
  EXPECT_EQ(evaluated, 0);
  EXPECT_TRUE(Captured().empty());
  STAGEWISE_LOG(ERROR) << "shown " << count();
  EXPECT_EQ(evaluated, 1);
  ASSERT_EQ(Captured().size(), 1u);
  EXPECT_EQ(Captured()[0][0], 'E');
}

TEST_F(LogTest, OffSilencesEverything) {
  log::SetLogLevel(log::Level::kOff);
  STAGEWISE_LOG(ERROR) << "nothing";
  EXPECT_TRUE(Captured().empty());
}

TEST_F(LogTest, WorksAsTheOnlyStatementOfAnIf) {
  log::SetLogLevel(log::Level::kDebug);
  bool flag = false;
  if (flag)
    STAGEWISE_LOG(INFO) << "not this";
  else
    STAGEWISE_LOG(DEBUG) << "this";
  ASSERT_EQ(Captured().size(), 1u);
  EXPECT_THAT(Captured()[0], HasSubstr("] this"));
}

TEST(LogLevelTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*log::ParseLevel("debug"), log::Level::kDebug);
  EXPECT_EQ(*log::ParseLevel("INFO"), log::Level::kInfo);
  EXPECT_EQ(*log::ParseLevel("warn"), log::Level::kWarning);
  EXPECT_EQ(*log::ParseLevel("Warning"), log::Level::kWarning);
  EXPECT_EQ(*log::ParseLevel("error"), log::Level::kError);
  EXPECT_EQ(*log::ParseLevel("off"), log::Level::kOff);
  auto bad = log::ParseLevel("verbose");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'verbose'"));
  for (auto level : {log::Level::kDebug, log::Level::kInfo, log::Level::kWarning,
                     log::Level::kError, log::Level::kOff}) {
    EXPECT_EQ(*log::ParseLevel(log::LevelName(level)), level);
  }
}

absl::Status FailIf(bool fail) { return fail ? absl::NotFoundError("nope") : absl::OkStatus(); }

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Chain(bool fail, int* after) {
  STAGEWISE_RETURN_IF_ERROR(FailIf(fail));
  *after = 1;
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int x) {
  STAGEWISE_ASSIGN_OR_RETURN(int half, Half(x));
  STAGEWISE_ASSIGN_OR_RETURN(half, Half(half));  // an existing variable, same line family
  return half;
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheErrorAndGoesOnOtherwise) {
  int after = 0;
  EXPECT_EQ(Chain(true, &after).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(after, 0);
  EXPECT_TRUE(Chain(false, &after).ok());
  EXPECT_EQ(after, 1);
}

TEST(StatusMacrosTest, AssignOrReturnAssignsOrPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);  // 3 is odd
  EXPECT_EQ(Quarter(5).status().message(), "odd");
}

}  // namespace
}  // namespace stagewise
