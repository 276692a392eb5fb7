// TokenFile (services/rpc/tokens.h): a tokens file reloaded while the
// coordinator runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "services/rpc/tokens.h"

namespace stagewise::rpc {
namespace {

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/stagewise-tokens-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/tokens";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& text) {
    std::ofstream(path_ + ".tmp", std::ios::trunc) << text;
    std::filesystem::permissions(
        path_ + ".tmp", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    std::filesystem::rename(path_ + ".tmp", path_);
  }
  std::string dir_, path_;
};

constexpr char kAlice[] = "alice-0123456789abcdef";
constexpr char kBob[] = "bob-0123456789abcdefgh";

TEST_F(TokenFileTest, ReloadTakesChangesAndKeepsTheTablesOfCallsInFlight) {
  Write(std::string(kAlice) + " admin alice\n");
  auto file = TokenFile::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  std::shared_ptr<const TokenTable> before = (*file)->table();
  EXPECT_TRUE(before->Authenticate(std::string("Bearer ") + kAlice).ok());

  auto same = (*file)->Reload();
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(*same) << "nothing changed";
  // The same tokens written again, with comments: still no change.
  Write(std::string("# rotated\n") + kAlice + " admin alice  # still here\n");
  same = (*file)->Reload();
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(*same);

  Write(std::string(kBob) + " read bob\n");
  auto changed = (*file)->Reload();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  std::shared_ptr<const TokenTable> after = (*file)->table();
  EXPECT_EQ(after->Authenticate(std::string("Bearer ") + kAlice).status().code(),
            absl::StatusCode::kUnauthenticated);
  auto bob = after->Authenticate(std::string("Bearer ") + kBob);
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->name, "bob");
  EXPECT_EQ(bob->role, Role::kRead);
  // A table handed out before the reload is unchanged.
  EXPECT_TRUE(before->Authenticate(std::string("Bearer ") + kAlice).ok());

  // A role change is a change.
  Write(std::string(kBob) + " admin bob\n");
  changed = (*file)->Reload();
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(*changed);
  EXPECT_EQ((*file)->table()->Authenticate(std::string("Bearer ") + kBob)->role, Role::kAdmin);
}

TEST_F(TokenFileTest, ABrokenOrMissingFileKeepsTheTokensInForce) {
  Write(std::string(kAlice) + " admin alice\n");
  auto file = TokenFile::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  Write("half-edited line\n");
  auto broken = (*file)->Reload();
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(broken.status().message().find(path_ + ":1:"), std::string::npos) << broken.status();
  EXPECT_TRUE((*file)->table()->Authenticate(std::string("Bearer ") + kAlice).ok());

  std::filesystem::remove(path_);
  auto missing = (*file)->Reload();
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot read"), std::string::npos);
  EXPECT_TRUE((*file)->table()->Authenticate(std::string("Bearer ") + kAlice).ok());
  EXPECT_EQ((*file)->path(), path_);
}

TEST_F(TokenFileTest, OpenFailsLikeLoad) {
  auto missing = TokenFile::Open(path_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path_), std::string::npos);
}

}  // namespace
}  // namespace stagewise::rpc
