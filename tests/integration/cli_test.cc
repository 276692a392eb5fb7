// The `stagewise` binary as a user runs it: real child processes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {
namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("stagewise_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result Stagewise(const std::string& args) {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    // Profiles (plan, and jobs the coordinator plans) stay in the test's directory.
    const std::string cmd = "STAGEWISE_PROFILE_CACHE=" + (dir_ / "profiles").string() + " " +
                            std::string(STAGEWISE_BINARY_DIR) + "/bin/stagewise " + args + " >" +
                            out.string() + " 2>" + err.string() + " </dev/null";
    Result r;
    const int status = std::system(cmd.c_str());
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  std::string WriteJob(const std::string& yaml) {
    const fs::path p = dir_ / "job.yaml";
    std::ofstream(p) << yaml;
    return p.string();
  }

  fs::path dir_;
};

constexpr const char* kTinyJob = R"(name: tiny
seed: 3
model: {name: mlp, hidden: [32]}
data: {dataset: synthetic, train_size: 512, test_size: 128, shape: [1, 8, 8], classes: 4}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 32
steps: 40
)";

TEST_F(Cli, HelpListsTheCommands) {
  Result r = Stagewise("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("train-local"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("validate"), std::string::npos);
  EXPECT_NE(r.out.find("version"), std::string::npos);
}

TEST_F(Cli, VersionNamesTheProjectAndLibTorch) {
  Result r = Stagewise("version");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("stagewise ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("LibTorch"), std::string::npos);
}

TEST_F(Cli, NoCommandIsAUsageError) {
  Result r = Stagewise("");
  EXPECT_EQ(r.code, 2);
}

TEST_F(Cli, TrainLocalTrainsAndReportsJson) {
  Result r = Stagewise("train-local -o json --threads 1 " + WriteJob(kTinyJob));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"job\":\"tiny\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"steps\":40"), std::string::npos) << r.out;
  const size_t at = r.out.find("\"test_accuracy\":");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stod(r.out.substr(at + 16)), 0.8) << r.out;
  EXPECT_NE(r.err.find("step 40/40"), std::string::npos) << r.err;  // progress lines
}

TEST_F(Cli, StepsFlagOverridesTheSpec) {
  Result r = Stagewise("train-local -q -o json --steps 5 " + WriteJob(kTinyJob));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"steps\":5"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(Cli, UnknownKeyIsRejectedNamingTheKey) {
  Result r = Stagewise("train-local " + WriteJob(std::string(kTinyJob) + "optimiser: {lr: 1}\n"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("optimiser"), std::string::npos) << r.err;
}

TEST_F(Cli, BadValueIsRejectedNamingTheKey) {
  std::string job = kTinyJob;
  job.replace(job.find("momentum: 0.9"), 13, "momentum: 1.5");
  Result r = Stagewise("validate " + WriteJob(job));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("optimizer.momentum"), std::string::npos) << r.err;
}

TEST_F(Cli, MissingDataIsAClearError) {
  std::string job = kTinyJob;
  job.replace(job.find("{dataset: synthetic"), 19, "{dataset: cifar10, path: /nonexistent/cifar");
  Result r = Stagewise("train-local " + WriteJob(job));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("/nonexistent/cifar"), std::string::npos) << r.err;
}

TEST_F(Cli, CheckpointsAreWrittenAndResumed) {
  const std::string ckpt = (dir_ / "ckpt").string();
  std::string job = std::string(kTinyJob) + "checkpoint: {dir: " + ckpt + ", every_steps: 20}\n";
  const std::string path = WriteJob(job);
  Result first = Stagewise("train-local -q -o json --steps 20 " + path);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_TRUE(fs::exists(ckpt + "/step-000000020.pt"));
  Result second = Stagewise("train-local -o json " + path);  // resumes at 20, runs to 40
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(second.out.find("\"steps\":40"), std::string::npos) << second.out;
  EXPECT_TRUE(fs::exists(ckpt + "/step-000000040.pt"));
}

TEST_F(Cli, ValidatePrintsBlocksAndStages) {
  Result r =
      Stagewise(std::string("validate ") + STAGEWISE_SOURCE_DIR + "/examples/quickstart.yaml");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("reversible"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("head"), std::string::npos);
}

TEST_F(Cli, EveryExampleValidates) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(STAGEWISE_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    Result r = Stagewise("validate " + e.path().string());
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.err;
    ++n;
  }
  EXPECT_GE(n, 1);
}

// Examples run as written (shortened to two steps here; the README notes
// full-length results).
TEST_F(Cli, EveryExampleTrainsTwoSteps) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(STAGEWISE_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    Result r = Stagewise("train-local -q -o json --no-resume --steps 2 " + e.path().string());
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.err;
    EXPECT_NE(r.out.find("\"steps\":2"), std::string::npos) << e.path() << ": " << r.out;
    ++n;
  }
  EXPECT_GE(n, 3);
}

// The same through the real algorithms: a coordinator and one worker process
// per stage, two steps (per phase) each.
constexpr const char* kTinyRevNet = R"(name: tiny-revnet
seed: 3
model: {name: revnet, depth: 18, width: 4, blocks: [2, 2, 1, 1]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [1, 12, 12], classes: 4}
algorithm: backprop
stages: {count: 2, partition: auto}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 16
steps: 2
)";

TEST_F(Cli, PlanPrintsPartitionModesAndPredictionsAndCachesTheProfile) {
  const std::string job = WriteJob(kTinyRevNet);
  Result r = Stagewise("plan --repeats 1 " + job);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want :
       {"profile of revnet", "reversible", "stage", "predicted time per mini-batch", "backprop",
        "petra", "delayed", "nwise n=1"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " in\n" << r.out;
  }
  EXPECT_EQ(r.err.find("(cached)"), std::string::npos) << r.err;
  // Second time: from the cache, as JSON.
  r = Stagewise("plan --repeats 1 -o json " + job);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("(cached)"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\"profile_cached\": true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"modes\": [\"fixed\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"predictions\""), std::string::npos) << r.out;
  // Every reversible block rebuilding when the budget is tight; nothing fits
  // under a tiny one (exit 1, naming the cap); a bad size is exit 2.
  r = Stagewise("plan -q --no-profile --modes rebuild " + job);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find(" store"), std::string::npos) << r.out;
  r = Stagewise("plan -q --memory-budget 1KiB " + job);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("memory cap"), std::string::npos) << r.err;
  r = Stagewise("plan -q --memory-budget lots " + job);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--memory-budget"), std::string::npos) << r.err;
  // A batch-size sweep picks one.
  r = Stagewise("plan -q --no-profile --repeats 1 --batch-sizes 8,16 " + job);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("<- best"), std::string::npos) << r.out;
}

TEST_F(Cli, AutoPartitionJobRunsOnLocalWorkers) {
  Result r = Stagewise("local -q -o json --threads 1 " + WriteJob(kTinyRevNet));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"state\":\"SUCCEEDED\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("plan.stage0.block_end"), std::string::npos) << r.out;
}

TEST_F(Cli, EveryExampleRunsTwoStepsOnLocalWorkers) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(STAGEWISE_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    Result r = Stagewise("local -q -o json --threads 1 --steps 2 " + e.path().string());
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.err;
    EXPECT_NE(r.out.find("\"state\":\"SUCCEEDED\""), std::string::npos)
        << e.path() << ": " << r.out;
    ++n;
  }
  EXPECT_GE(n, 3);
}

}  // namespace
