// ConfinePath: the paths of a job spec stay under the operator's roots.
#include "services/common/path_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "stagewise_paths_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = fs::path(pattern);
    fs::create_directories(dir_ / "root" / "data");
    fs::create_directories(dir_ / "outside");
    fs::create_directories(dir_ / "root2");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  PathRoots Policy() const { return {true, {(dir_ / "root").string()}, "--data-root"}; }
  fs::path dir_;
};

TEST_F(PathPolicyTest, PathsInsideARootAreAcceptedResolved) {
  auto p = ConfinePath("data.path", (dir_ / "root" / "data").string(), Policy());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, fs::canonical(dir_ / "root" / "data").string());
  // The root itself, and a directory that does not exist yet (checkpoints).
  EXPECT_TRUE(ConfinePath("data.path", (dir_ / "root").string(), Policy()).ok());
  EXPECT_TRUE(ConfinePath("data.path", (dir_ / "root" / "new" / "deeper").string(), Policy()).ok());
  EXPECT_TRUE(ConfinePath("data.path", (dir_ / "root" / "." / "data").string(), Policy()).ok());
}

TEST_F(PathPolicyTest, ATorchScriptModelFileMustBeUnderAModelRoot) {
  const fs::path file = dir_ / "root" / "net.pt";
  const PathRoots file_only{true, {file.string()}, "--model-root"};
  ModelSpec model;
  model.name = ModelKind::kTorchScript;
  model.path = "net.pt";  // as the user wrote it; the CLI resolved it:
  model.script_file = (dir_ / "root" / "." / "net.pt").string();
  ASSERT_TRUE(ConfineModelFile(&model, file_only).ok());
  EXPECT_EQ(model.script_file, (fs::canonical(dir_ / "root") / "net.pt").string());
  // Another file beside it is not the root.
  model.script_file = (dir_ / "root" / "other.pt").string();
  absl::Status s = ConfineModelFile(&model, file_only);
  EXPECT_THAT(std::string(s.message()), HasSubstr("script_model.file: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("outside --model-root"));
  // Without a section, model.path is what is checked.
  model.script_file.clear();
  model.path = (dir_ / "outside" / "net.pt").string();
  s = ConfineModelFile(&model, {true, {(dir_ / "root").string()}, "--model-root"});
  EXPECT_THAT(std::string(s.message()), HasSubstr("model.path: "));
  // No root at all: refused, naming the flag.
  model.script_file = file.string();
  s = ConfineModelFile(&model, {true, {}, "--model-root"});
  EXPECT_THAT(std::string(s.message()), HasSubstr("started without --model-root"));
  // The zoo's models name no file.
  ModelSpec zoo;
  zoo.name = ModelKind::kRevNet;
  EXPECT_TRUE(ConfineModelFile(&zoo, {true, {}, "--model-root"}).ok());
}

TEST_F(PathPolicyTest, EmptyMeansNoneAndUnconfinedPassesAnything) {
  auto empty = ConfinePath("checkpoint.dir", "", Policy());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
  PathRoots open;  // confine = false
  auto any = ConfinePath("data.path", "/etc/../etc", open);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(*any, "/etc/../etc");
}

TEST_F(PathPolicyTest, OutsideEveryRootIsRefusedNamingTheKeyAndTheFlag) {
  auto p = ConfinePath("data.path", (dir_ / "outside").string(), Policy());
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("data.path"));
  EXPECT_THAT(p.status().message(), HasSubstr("--data-root"));
  EXPECT_EQ(ConfinePath("data.path", "/etc", Policy()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A sibling whose name starts like the root is not inside it.
  fs::create_directories(dir_ / "rootx");
  EXPECT_EQ(ConfinePath("data.path", (dir_ / "rootx").string(), Policy()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PathPolicyTest, DotDotIsRefusedEvenWhenItStaysInside) {
  for (const std::string& bad : {(dir_ / "root" / ".." / "outside").string(),
                                 (dir_ / "root" / "data" / ".." / "data").string()}) {
    auto p = ConfinePath("checkpoint.dir", bad, Policy());
    ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(p.status().message(), HasSubstr("checkpoint.dir"));
    EXPECT_THAT(p.status().message(), HasSubstr(".."));
  }
}

TEST_F(PathPolicyTest, SymlinksOutOfTheRootAreRefused) {
  fs::create_directory_symlink(dir_ / "outside", dir_ / "root" / "escape");
  auto p = ConfinePath("data.path", (dir_ / "root" / "escape").string(), Policy());
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("symlink"));
  EXPECT_EQ(ConfinePath("data.path", (dir_ / "root" / "escape" / "sub").string(), Policy())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A symlink that stays inside is fine.
  fs::create_directory_symlink(dir_ / "root" / "data", dir_ / "root" / "alias");
  EXPECT_TRUE(ConfinePath("data.path", (dir_ / "root" / "alias").string(), Policy()).ok());
  // A root that is itself a symlink is resolved too.
  fs::create_directory_symlink(dir_ / "root", dir_ / "linked-root");
  PathRoots linked{true, {(dir_ / "linked-root").string()}, "--data-root"};
  EXPECT_TRUE(ConfinePath("data.path", (dir_ / "root" / "data").string(), linked).ok());
}

TEST_F(PathPolicyTest, RelativePathsResolveAgainstTheWorkingDirectory) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  PathRoots relative{true, {"root"}, "--checkpoint-root"};
  EXPECT_TRUE(ConfinePath("checkpoint.dir", "root/ckpt", relative).ok());
  EXPECT_EQ(ConfinePath("checkpoint.dir", "outside", relative).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::current_path(cwd);
}

TEST_F(PathPolicyTest, NoRootsRefusesEveryPathAndSaysWhichFlagAllowsOne) {
  PathRoots none{true, {}, "--checkpoint-root"};
  auto p = ConfinePath("checkpoint.dir", (dir_ / "root").string(), none);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("started without --checkpoint-root"));
}

TEST_F(PathPolicyTest, HostileValuesAreRefusedWithoutEchoingThemWhole) {
  const std::string huge(100000, 'a');
  auto p = ConfinePath("data.path", huge, Policy());
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(p.status().message().size(), 300u);
  EXPECT_EQ(ConfinePath("data.path", std::string("/tmp/a\x1b[2Jb"), Policy()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfinePath("data.path", std::string("/tmp/a\0b", 8), Policy()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagewise
