// The `stagewise` binary as a user runs it: real child processes.
#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"

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

  // `env`: extra VAR=value words before the binary.
  Result Stagewise(const std::string& args, const std::string& env = "") {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    // Everything a run leaves stays in the test's directory: profiles (plan,
    // and jobs the coordinator plans), `local`'s logs (TMPDIR) and relative
    // checkpoint directories (the examples').
    const std::string cmd =
        "cd " + dir_.string() + " && STAGEWISE_PROFILE_CACHE=" + (dir_ / "profiles").string() +
        " TMPDIR=" + dir_.string() + " " + env + " " + std::string(STAGEWISE_BINARY_DIR) +
        "/bin/stagewise " + args + " >" + out.string() + " 2>" + err.string() + " </dev/null";
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

// Every binary answers --version with its name and the same version (what
// an operator checks first on a host).
TEST_F(Cli, EveryBinaryPrintsItsVersion) {
  std::string versions;
  for (const char* binary : {"stagewise", "stagewise-worker", "stagewise-coordinator"}) {
    const fs::path out = dir_ / "version.out";
    const std::string cmd = std::string(STAGEWISE_BINARY_DIR) + "/bin/" + binary + " --version >" +
                            out.string() + " 2>&1 </dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << binary;
    const std::string text = Slurp(out);
    ASSERT_EQ(text.rfind(std::string(binary) + " ", 0), 0u) << text;
    const std::string version =
        text.substr(std::strlen(binary) + 1,
                    text.find_first_of(" \n", std::strlen(binary) + 1) - std::strlen(binary) - 1);
    EXPECT_FALSE(version.empty()) << text;
    if (!versions.empty()) EXPECT_EQ(version, versions) << binary;
    versions = version;
  }
}

// A SOURCE that looks like a path is a file: a missing one is said so, not
// sent to the coordinator as a job id (none listens here: that would be exit
// 3, "cannot reach the coordinator").
TEST_F(Cli, ASourceThatLooksLikeAFileIsAFile) {
  for (const std::string cmd :
       {"plot ./nonexist.tsv --output-file o.svg", "doctor x.json", "trace no/such.json"}) {
    Result r = Stagewise(cmd, "STAGEWISE_COORDINATOR=127.0.0.1:1");
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.err;
    EXPECT_EQ(r.err.find("reach"), std::string::npos) << cmd << ": " << r.err;
    const std::string file =
        cmd.substr(cmd.find(' ') + 1, cmd.find(' ', cmd.find(' ') + 1) - cmd.find(' ') - 1);
    EXPECT_NE(r.err.find(file + ": "), std::string::npos) << r.err;
  }
}

TEST_F(Cli, NoCommandIsAUsageError) {
  Result r = Stagewise("");
  EXPECT_EQ(r.code, 2);
}

TEST_F(Cli, TrainLocalTrainsAndReportsJson) {
  Result r = Stagewise("train-local -o json --threads 1 " + WriteJob(kTinyJob));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"name\":\"tiny\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"step\":40,"), std::string::npos) << r.out;
  const size_t at = r.out.find("\"eval_accuracy\":");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stod(r.out.substr(at + 16)), 0.8) << r.out;
  EXPECT_NE(r.err.find("step 40/40"), std::string::npos) << r.err;  // progress lines
}

TEST_F(Cli, StepsFlagOverridesTheSpec) {
  Result r = Stagewise("train-local -q -o json --steps 5 " + WriteJob(kTinyJob));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"step\":5,"), std::string::npos) << r.out;
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
  // The layout of a distributed job's checkpoints (one stage holding every
  // block), under the job's name.
  EXPECT_TRUE(fs::exists(ckpt + "/tiny/step-0000000020/MANIFEST"));
  EXPECT_TRUE(fs::exists(ckpt + "/tiny/step-0000000020/stage-0.pt"));
  Result second = Stagewise("train-local -o json " + path);  // resumes at 20, runs to 40
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(second.out.find("\"step\":40,"), std::string::npos) << second.out;
  EXPECT_TRUE(fs::exists(ckpt + "/tiny/step-0000000040/MANIFEST"));
  // So `export` reads it as it reads a distributed job's.
  const std::string exported = (dir_ / "exported").string();
  Result e = Stagewise("export --checkpoint " + ckpt + "/tiny --output-dir " + exported);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("after step 40"), std::string::npos) << e.out;
  EXPECT_TRUE(fs::exists(exported + "/model.pt"));
}

TEST_F(Cli, SetOverridesKeysOfTheJobFile) {
  const std::string path = WriteJob(kTinyJob);
  Result r = Stagewise(
      "train-local -o json --set steps=3 --set algorithm.name=backprop "
      "--set data.limit_test=16 " +
      path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\"step\":3,"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("(16 samples)"), std::string::npos) << r.err;
  // Errors name the key as the spec does, or the bad assignment.
  r = Stagewise("validate --set optimizer.momentum=1.5 " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("optimizer.momentum"), std::string::npos) << r.err;
  r = Stagewise("validate --set model.name.x=1 " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--set model.name.x=1: model.name is 'mlp', not a map"), std::string::npos)
      << r.err;
  r = Stagewise("validate --set steps " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("expected KEY=VALUE"), std::string::npos) << r.err;
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
    // A short evaluation: the examples evaluate on their whole test sets.
    Result r = Stagewise("train-local -q -o json --no-resume --steps 2 --set data.limit_test=256 " +
                         e.path().string());
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.err;
    EXPECT_NE(r.out.find("\"step\":2,"), std::string::npos) << e.path() << ": " << r.out;
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
  EXPECT_NE(r.out.find("\"profile_cached\":true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"modes\":[\"fixed\""), std::string::npos) << r.out;
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

// `local` honours the job's device or --devices: on CPU devices here; a job
// that asks for a GPU this machine lacks is refused before anything starts.
TEST_F(Cli, LocalPutsWorkersOnTheDevicesAskedForAndRefusesMissingGpus) {
  const std::string job = WriteJob(std::string(kTinyJob) + "stages: 2\n");
  Result r = Stagewise("local -o json --threads 1 --steps 3 --devices cpu,cpu " + job);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("on cpu,cpu)"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("\"state\":\"SUCCEEDED\""), std::string::npos) << r.out;

  Result flag = Stagewise("local -q --devices cpu,gpu " + job);
  EXPECT_EQ(flag.code, 2) << flag.err;
  EXPECT_NE(flag.err.find("--devices: 'gpu'"), std::string::npos) << flag.err;

  if (fs::exists("/dev/nvidia0")) GTEST_SKIP() << "this machine has a GPU";
  for (const char* device : {"cuda", "cuda:0"}) {
    Result gpu = Stagewise(absl::StrCat("local -q --set device=", device, " ", job));
    EXPECT_EQ(gpu.code, 2) << gpu.err;
    EXPECT_NE(gpu.err.find(absl::StrCat("device: ", device, " asks for a GPU")), std::string::npos)
        << gpu.err;
    EXPECT_EQ(gpu.out, "");
  }
}

TEST_F(Cli, EveryExampleRunsTwoStepsOnLocalWorkers) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(std::string(STAGEWISE_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    // A planned example profiles its model first (minutes for the Reformer at
    // five timed rounds): a one-round profile from `plan` seeds the cache the
    // coordinator's profiling worker reads (same model, batch, device and
    // threads), which `local` must then use.
    const bool planned = Slurp(e.path()).find("partition: auto") != std::string::npos;
    if (planned) {
      Result p =
          Stagewise("plan -q --no-profile --threads 1 --repeats 1 --warmup 0 " + e.path().string());
      EXPECT_EQ(p.code, 0) << e.path() << ": " << p.err;
    }
    Result r = Stagewise("local -q -o json --threads 1 --steps 2 --set data.limit_test=256 " +
                         e.path().string());
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.err;
    EXPECT_NE(r.out.find("\"state\":\"SUCCEEDED\""), std::string::npos)
        << e.path() << ": " << r.out;
    if (planned) {
      EXPECT_NE(r.out.find("\"plan.profile_cached\":1"), std::string::npos)
          << e.path() << ": " << r.out;
    }
    ++n;
  }
  EXPECT_GE(n, 3);
}

// ---------------------------------------------------------------------------
// Users' own models (docs/torchscript.md), from tests/fixtures/torchscript.

std::string TorchScriptJob(const std::string& fixture, const std::string& algorithm) {
  return std::string(R"(name: ts
seed: 1
model: {name: torchscript, path: ")") +
         STAGEWISE_SOURCE_DIR + "/tests/fixtures/torchscript/" + fixture + R"("}
data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 28, 28], classes: 10}
algorithm: )" +
         algorithm + R"(
stages: 2
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 32
steps: 4
)";
}

// A trace file (`local --trace`, `trace -o`) as a reader of Chrome's format
// sees it.
struct TracedSpan {
  std::string name;
  int64_t ts = 0, dur = 0, step = 0, micro_batch = 0;
};
struct TraceFile {
  std::map<int, std::string> process_names;       // pid -> "stage j"
  std::map<int, std::vector<TracedSpan>> tracks;  // pid -> X events in file order
  int64_t origin_unix_us = 0;
  int64_t clock_rtt_us = 0;
};

TraceFile ReadTrace(const fs::path& path) {
  TraceFile out;
  google::protobuf::Struct root;
  const auto parsed = google::protobuf::util::JsonStringToMessage(Slurp(path), &root);
  EXPECT_TRUE(parsed.ok()) << path << ": " << parsed.ToString();
  const auto& other = root.fields().at("otherData").struct_value().fields();
  out.origin_unix_us = std::stoll(other.at("origin_unix_us").string_value());
  out.clock_rtt_us = static_cast<int64_t>(other.at("clock_rtt_us").number_value());
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& e = v.struct_value().fields();
    const int pid = static_cast<int>(e.at("pid").number_value());
    const auto& args = e.at("args").struct_value().fields();
    if (e.at("ph").string_value() == "M" && e.at("name").string_value() == "process_name") {
      out.process_names[pid] = args.at("name").string_value();
    }
    if (e.at("ph").string_value() != "X") continue;
    TracedSpan s;
    s.name = e.at("name").string_value();
    s.ts = static_cast<int64_t>(e.at("ts").number_value());
    s.dur = static_cast<int64_t>(e.at("dur").number_value());
    s.step = static_cast<int64_t>(args.at("step").number_value());
    s.micro_batch = static_cast<int64_t>(args.at("micro_batch").number_value());
    out.tracks[pid].push_back(s);
  }
  return out;
}

// One named track per stage with forward and backward spans; spans of a
// track never overlap; with `causal`, the forward of every (mini-batch,
// micro-batch) on stage j starts after it ended on stage j-1, within the
// clocks' stated uncertainty.
void CheckTrace(const TraceFile& trace, int stages, const std::string& what, bool causal) {
  ASSERT_EQ(trace.tracks.size(), static_cast<size_t>(stages)) << what;
  ASSERT_EQ(trace.process_names.size(), static_cast<size_t>(stages)) << what;
  std::map<std::tuple<int, int64_t, int64_t>, TracedSpan> forwards;
  for (int j = 0; j < stages; ++j) {
    EXPECT_EQ(trace.process_names.at(j), "stage " + std::to_string(j)) << what;
    ASSERT_TRUE(trace.tracks.count(j)) << what << ": no track for stage " << j;
    const auto& spans = trace.tracks.at(j);
    std::set<std::string> names;
    for (size_t i = 0; i < spans.size(); ++i) {
      names.insert(spans[i].name);
      if (i > 0) {
        EXPECT_LE(spans[i - 1].ts + spans[i - 1].dur, spans[i].ts)
            << what << ": stage " << j << " " << spans[i - 1].name << " of step "
            << spans[i - 1].step << " overlaps " << spans[i].name << " of step " << spans[i].step;
      }
      if (spans[i].name == "forward") {
        forwards[{j, spans[i].step, spans[i].micro_batch}] = spans[i];
      }
    }
    EXPECT_TRUE(names.count("forward")) << what << ": stage " << j;
    EXPECT_TRUE(names.count("backward")) << what << ": stage " << j;
  }
  if (!causal) return;
  for (const auto& [key, s] : forwards) {
    const auto& [j, step, mb] = key;
    if (j == 0) continue;
    auto below = forwards.find({j - 1, step, mb});
    ASSERT_NE(below, forwards.end()) << what << ": stage " << j - 1 << " never forwarded step "
                                     << step << " (the whole job is traced)";
    EXPECT_LE(below->second.ts + below->second.dur, s.ts + std::max<int64_t>(trace.clock_rtt_us, 0))
        << what << ": stage " << j << " forwards step " << step << "." << mb << " before stage "
        << j - 1 << " finished it";
  }
}

TEST_F(Cli, TorchScriptModelsTrainWithEveryAlgorithmOnLocalWorkers) {
  struct Case {
    std::string fixture, algorithm;
  };
  const std::vector<Case> cases = {
      // Not reversible (PETRA stores every block's input).
      {"mlp_twin.pt", "{name: backprop, micro_batches: 2}"},
      {"mlp_twin.pt", "{name: petra}"},
      // Reversible blocks 1 and 2.
      {"revnet_twin.pt", "{name: backprop, micro_batches: 2, schedule: 1f1b}"},
      {"revnet_twin.pt", "{name: petra}"},
      {"revnet_twin.pt", "{name: delayed}"},
      {"revnet_twin.pt", "{name: features_replay}"},
      {"revnet_twin.pt", "{name: nwise, n: 1, aux_head: linear}"},
      {"revnet_twin.pt", "{name: auxnet}"},
  };
  // Every run keeps its metric history, and `plot` draws them all at the end:
  // the curves work whatever the algorithm.
  std::string histories;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const fs::path history = dir_ / ("history" + std::to_string(i) + ".tsv");
    const fs::path trace = dir_ / ("trace" + std::to_string(i) + ".json");
    Result r =
        Stagewise("local -q -o json --threads 1 --history " + history.string() + " --trace " +
                  trace.string() + " " + WriteJob(TorchScriptJob(c.fixture, c.algorithm)));
    EXPECT_EQ(r.code, 0) << c.fixture << " " << c.algorithm << ": " << r.err;
    EXPECT_NE(r.out.find("\"state\":\"SUCCEEDED\""), std::string::npos)
        << c.fixture << " " << c.algorithm << ": " << r.out;
    const std::string text = Slurp(history);
    EXPECT_NE(text.find("\ttrain_loss\t"), std::string::npos) << c.algorithm << ": " << text;
    EXPECT_NE(text.find("4\t"), std::string::npos) << c.algorithm << ": " << text;
    histories += " " + history.string();
    // The timeline too (auxnet's stages forward their auxiliary inputs at
    // once: no order between stages).
    CheckTrace(ReadTrace(trace), 2, c.fixture + " " + c.algorithm,
               c.algorithm.find("auxnet") == std::string::npos);
    Result drawn = Stagewise("trace " + trace.string() + " --svg " +
                             (dir_ / ("timeline" + std::to_string(i) + ".svg")).string());
    EXPECT_EQ(drawn.code, 0) << drawn.err;
    EXPECT_NE(drawn.out.find("2 stages"), std::string::npos) << drawn.out;
  }
  if (std::system("command -v gnuplot >/dev/null") == 0) {
    Result r = Stagewise("plot" + histories + " --output-file " + (dir_ / "all.svg").string());
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("(8 jobs)"), std::string::npos) << r.out;
    const std::string svg = Slurp(dir_ / "all.svg");
    for (const char* algorithm :
         {"(backprop)", "(petra)", "(delayed)", "(features_replay)", "(nwise)", "(auxnet)"}) {
      EXPECT_NE(svg.find(algorithm), std::string::npos) << algorithm;
    }
  }
  // The planner profiles scripted blocks too (partition: auto, on a worker).
  std::string yaml = TorchScriptJob("revnet_twin.pt", "{name: petra}");
  yaml.replace(yaml.find("stages: 2"), 9, "stages: {count: 2, partition: auto}");
  Result r = Stagewise("local -q -o json --threads 1 " + WriteJob(yaml));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("plan.stage0.block_end"), std::string::npos) << r.out;
}

TEST_F(Cli, BadTorchScriptFilesAreRefusedBeforeAnythingStarts) {
  Result r = Stagewise("validate " + WriteJob(TorchScriptJob("bad_inverse.pt", "backprop")));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("bad_inverse.pt: block 1 exports `inverse`, but it does not invert"),
            std::string::npos)
      << r.err;
  // `local` stops before starting a coordinator or workers.
  r = Stagewise("local " + WriteJob(TorchScriptJob("no_blocks.pt", "backprop")));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("has no `blocks`"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("starting a coordinator"), std::string::npos) << r.err;
  // A relative model.path is read beside the job file, not in the working
  // directory (the test runs in its own directory; the job is elsewhere).
  const fs::path jobs = dir_ / "jobs";
  fs::create_directories(jobs);
  fs::copy_file(std::string(STAGEWISE_SOURCE_DIR) + "/tests/fixtures/torchscript/mlp_twin.pt",
                jobs / "model.pt");
  std::string yaml = TorchScriptJob("mlp_twin.pt", "backprop");
  const size_t at = yaml.find("path: \"");
  yaml.replace(at, yaml.find("\"}", at) + 1 - at, "path: model.pt");
  std::ofstream(jobs / "job.yaml") << yaml;
  r = Stagewise("train-local -o json --steps 2 " + (jobs / "job.yaml").string());
  EXPECT_EQ(r.code, 0) << r.err;
}

// ---------------------------------------------------------------------------
// Fault tolerance: checkpoints of a distributed job, export, chaos.

// The value of "key":"..." or "key":123 in one line of JSON.
std::string JsonField(const std::string& json, const std::string& key) {
  std::smatch m;
  if (std::regex_search(json, m, std::regex("\"" + key + "\":(\"([^\"]*)\"|[-0-9.]+)"))) {
    return m[2].matched ? m[2].str() : m[1].str();
  }
  return "";
}

// "logs kept in DIR" on stderr.
std::string KeptLogs(const std::string& err) {
  std::smatch m;
  return std::regex_search(err, m, std::regex("logs kept in ([^\n]+)")) ? m[1].str() : "";
}

// A real coordinator on an existing database, stopped at the end of scope.
class CoordinatorProcess {
 public:
  CoordinatorProcess(const fs::path& db, const fs::path& dir)
      : port_file_(dir / "coordinator-again.port") {
    const std::string binary = std::string(STAGEWISE_BINARY_DIR) + "/bin/stagewise-coordinator";
    const std::string log = (dir / "coordinator-again.log").string();
    std::vector<std::string> args = {
        binary, "--listen",  "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
        "--db", db.string(), "--port-file", port_file_.string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~CoordinatorProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 1000; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  // "127.0.0.1:PORT" once it serves; "" if it does not within 30 s.
  std::string Address() {
    for (int i = 0; i < 3000; ++i) {
      std::ifstream in(port_file_);
      int port = 0;
      if (in >> port && port > 0) return "127.0.0.1:" + std::to_string(port);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "";
  }

 private:
  fs::path port_file_;
  pid_t pid_ = -1;
};

// Two stages with batch norm (buffers as well as parameters).
constexpr const char* kCheckpointedRevNet = R"(name: ckpt-revnet
seed: 5
model: {name: revnet, depth: 18, width: 4, blocks: [2, 2, 1, 1]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [1, 12, 12], classes: 4}
algorithm: backprop
stages: {count: 2}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 16
steps: 20
)";

// Every tensor of `whole` equals the same-named tensor of the shards of the
// checkpoint in `step_dir` (each loaded into its own stage model).
void ExpectEqualToTheShards(const stagewise::models::Model& whole, const stagewise::JobSpec& spec,
                            const fs::path& step_dir) {
  absl::StatusOr<stagewise::v1::CheckpointManifest> manifest =
      stagewise::checkpoint::ReadManifest(step_dir.string());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const auto params = whole.named_parameters();
  const auto buffers = whole.named_buffers();
  size_t compared = 0;
  for (const auto& shard : manifest->shards()) {
    auto stage = stagewise::models::BuildModel(spec.model, static_cast<uint64_t>(spec.seed),
                                               shard.block_begin(), shard.block_end());
    ASSERT_TRUE(stage.ok()) << stage.status();
    torch::serialize::InputArchive archive, model_archive;
    archive.load_from((step_dir / shard.file()).string());
    archive.read("model", model_archive);
    (*stage)->load(model_archive);
    for (const auto& p : (*stage)->named_parameters()) {
      ASSERT_NE(params.find(p.key()), nullptr) << p.key();
      EXPECT_TRUE(torch::equal(p.value(), params[p.key()])) << p.key();
      ++compared;
    }
    for (const auto& b : (*stage)->named_buffers()) {
      ASSERT_NE(buffers.find(b.key()), nullptr) << b.key();
      EXPECT_TRUE(torch::equal(b.value(), buffers[b.key()])) << b.key();
      ++compared;
    }
  }
  EXPECT_EQ(compared, params.size() + buffers.size());
  EXPECT_GT(buffers.size(), 0u);  // batch norm statistics came along
}

TEST_F(Cli, CheckpointsOfALocalJobAreListedAndExported) {
  const fs::path ckpt = dir_ / "ckpt";
  Result r =
      Stagewise("local -q -o json --threads 1 --keep-logs " +
                WriteJob(std::string(kCheckpointedRevNet) + "checkpoint: {dir: " + ckpt.string() +
                         ", every_steps: 10, keep: 3}\n"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string job_id = JsonField(r.out, "job_id");
  ASSERT_FALSE(job_id.empty()) << r.out;
  const fs::path job_dir = ckpt / job_id;
  const fs::path last = job_dir / "step-0000000020";
  ASSERT_TRUE(fs::exists(last / "MANIFEST")) << r.err;
  ASSERT_TRUE(fs::exists(job_dir / "step-0000000010" / "MANIFEST")) << r.err;
  const std::string logs = KeptLogs(r.err);
  ASSERT_FALSE(logs.empty()) << r.err;

  // The coordinator again, on the database `local` kept: it still knows the job.
  CoordinatorProcess coordinator(fs::path(logs) / "coordinator.db", dir_);
  const std::string address = coordinator.Address();
  ASSERT_FALSE(address.empty()) << Slurp(dir_ / "coordinator-again.log");
  const std::string at = " --coordinator " + address;

  r = Stagewise("checkpoints " + job_id + at);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("STEP  PHASE  CREATED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(last.string()), std::string::npos) << r.out;
  EXPECT_LT(r.out.find("step-0000000020"), r.out.find("step-0000000010")) << r.out;  // newest first
  r = Stagewise("checkpoints -o json " + job_id + at);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(JsonField(r.out, "step"), "20") << r.out;
  EXPECT_EQ(JsonField(r.out, "dir"), job_dir.string()) << r.out;

  r = Stagewise("status " + job_id + at);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("last checkpoint step 20"), std::string::npos) << r.out;

  // Export through the coordinator (the files are on this machine).
  const fs::path exported = dir_ / "exported";
  r = Stagewise("export " + job_id + " --output-dir " + exported.string() + at);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("after step 20"), std::string::npos) << r.out;
  for (const char* file : {"model.pt", "job.yaml", "README.txt"}) {
    EXPECT_TRUE(fs::exists(exported / file)) << file;
    EXPECT_NE(r.out.find((exported / file).string()), std::string::npos) << r.out;
  }
  EXPECT_NE(Slurp(exported / "README.txt").find("torch.jit.load(\"model.pt\")"), std::string::npos);

  // model.pt loads into the model built from job.yaml and holds exactly the
  // shards' tensors.
  absl::StatusOr<stagewise::JobSpec> spec =
      stagewise::LoadJobSpec((exported / "job.yaml").string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = stagewise::models::BuildModel(spec->model, static_cast<uint64_t>(spec->seed));
  ASSERT_TRUE(model.ok()) << model.status();
  std::shared_ptr<stagewise::models::Model> whole = *model;
  torch::load(whole, (exported / "model.pt").string());
  ExpectEqualToTheShards(*whole, *spec, last);
  // ... which training changed.
  auto initial = stagewise::models::BuildModel(spec->model, static_cast<uint64_t>(spec->seed));
  bool changed = false;
  const auto initial_params = (*initial)->named_parameters();
  for (const auto& p : whole->named_parameters()) {
    changed = changed || !torch::equal(p.value(), initial_params[p.key()]);
  }
  EXPECT_TRUE(changed);

  // Offline: a job's checkpoint directory and --step picks the older one.
  const fs::path older = dir_ / "older";
  r = Stagewise("export --checkpoint " + job_dir.string() + " --step 10 --output-dir " +
                older.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("after step 10"), std::string::npos) << r.out;
  std::shared_ptr<stagewise::models::Model> at10 =
      *stagewise::models::BuildModel(spec->model, static_cast<uint64_t>(spec->seed));
  torch::load(at10, (older / "model.pt").string());
  ExpectEqualToTheShards(*at10, *spec, job_dir / "step-0000000010");
  r = Stagewise("export --checkpoint " + job_dir.string() + " --step 15 --output-dir " +
                older.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no committed checkpoint after step 15"), std::string::npos) << r.err;

  // A damaged shard is refused, naming the file; nothing is written.
  const fs::path copy = dir_ / "copy" / "step-0000000020";
  fs::create_directories(copy.parent_path());
  fs::copy(last, copy, fs::copy_options::recursive);
  {
    std::fstream shard(copy / "stage-1.pt", std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(100);
    shard.put('\x5a');
  }
  const fs::path refused = dir_ / "refused";
  r = Stagewise("export --checkpoint " + copy.string() + " --output-dir " + refused.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find((copy / "stage-1.pt").string()), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(refused / "model.pt"));
}

TEST_F(Cli, LocalChaosKillsProcessesAndTheJobStillSucceeds) {
  std::string job = std::string(kCheckpointedRevNet) +
                    "checkpoint: {dir: " + (dir_ / "ckpt").string() +
                    ", every_steps: 20, keep: 2}\n" + "recovery: {max_restarts: 5}\n";
  job.replace(job.find("steps: 20"), 9, "steps: 400");
  Result r = Stagewise(
      "local -o json --threads 1 --chaos 2 --chaos-coordinator 1 "
      "--chaos-seed 3 " +
      WriteJob(job));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(JsonField(r.out, "state"), "SUCCEEDED") << r.out;
  EXPECT_NE(r.err.find("chaos: killed "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("local: chaos: "), std::string::npos) << r.err;
  // Each worker kill started a new attempt.
  size_t worker_kills = 0;
  for (size_t at = r.err.find("chaos: killed worker"); at != std::string::npos;
       at = r.err.find("chaos: killed worker", at + 1)) {
    ++worker_kills;
  }
  EXPECT_GE(std::stoi(JsonField(r.out, "attempt")), static_cast<int>(worker_kills)) << r.out;
}

// Replicated stages (docs/replicas.md): 2 stages x 2 replicas, two workers
// killed at random moments and restarted; the job recovers from its
// checkpoints whether a recovering attempt waits for all 4 workers or, with
// recovery.elastic, goes on with the replicas whose workers are back.
TEST_F(Cli, LocalChaosOnReplicatedStagesSucceedsInBothRecoveryModes) {
  for (const std::string elastic : {"false", "true"}) {
    SCOPED_TRACE("recovery.elastic: " + elastic);
    const std::string job = std::string(R"(name: chaos-replicas
seed: 5
model: {name: emulated, depth: 4, forward_ms: 2, backward_ms: 4, reversible: false}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [2, 4, 4], classes: 4}
algorithm: backprop
stages: {count: 2, replicas: 2}
optimizer: {name: sgd, lr: 0.05}
batch_size: 16
steps: 400
checkpoint: {dir: )") + (dir_ / ("ckpt-" + elastic)).string() +
                            ", every_steps: 20, keep: 2}\nrecovery: {max_restarts: 6, elastic: " +
                            elastic + "}\n";
    Result r = Stagewise("local -o json --threads 1 --chaos 2 --chaos-seed 11 " + WriteJob(job));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(JsonField(r.out, "state"), "SUCCEEDED") << r.out;
    EXPECT_EQ(JsonField(r.out, "step"), "400") << r.out;
    size_t worker_kills = 0;
    for (size_t at = r.err.find("chaos: killed worker"); at != std::string::npos;
         at = r.err.find("chaos: killed worker", at + 1)) {
      ++worker_kills;
    }
    EXPECT_GE(worker_kills, 1u) << r.err;
    EXPECT_GE(std::stoi(JsonField(r.out, "attempt")), static_cast<int>(worker_kills)) << r.out;
  }
}

// A TorchScript job's checkpoint exports as the user's own module.
TEST_F(Cli, ATrainedTorchScriptModelIsExportedAsTorchScript) {
  const fs::path ckpt = dir_ / "ckpt";
  std::string yaml = TorchScriptJob("revnet_twin.pt", "{name: petra}");
  yaml += "checkpoint: {dir: " + ckpt.string() + ", every_steps: 4}\n";
  Result r = Stagewise("local -q -o json --threads 1 " + WriteJob(yaml));
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path exported = dir_ / "exported";
  r = Stagewise("export --checkpoint " + ckpt.string() + "/" + JsonField(r.out, "job_id") +
                " --output-dir " + exported.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(Slurp(exported / "README.txt").find("your TorchScript model"), std::string::npos);
  // The user's module, forward and all, with weights that training moved.
  torch::jit::Module trained = torch::jit::load((exported / "model.pt").string());
  torch::jit::Module initial = torch::jit::load(std::string(STAGEWISE_SOURCE_DIR) +
                                                "/tests/fixtures/torchscript/revnet_twin.pt");
  trained.eval();
  torch::Tensor logits = trained.forward({torch::randn({3, 1, 28, 28})}).toTensor();
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10}));
  auto weight = [](torch::jit::Module& m) {
    for (const auto& p : m.named_parameters()) {
      if (p.name == "blocks.1.body.layers.0.weight") return p.value;
    }
    return torch::Tensor();
  };
  ASSERT_TRUE(weight(trained).defined());
  EXPECT_GT((weight(trained) - weight(initial)).abs().max().item<double>(), 1e-4);
}

// Training curves: `local --history` then `plot` (gnuplot), rendered by a
// real SVG renderer.
uint32_t PngDimension(const std::string& png, size_t offset) {
  const auto* b = reinterpret_cast<const unsigned char*>(png.data() + offset);
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

TEST_F(Cli, LocalHistoryIsPlottedAndTheSvgRenders) {
  if (std::system("command -v gnuplot >/dev/null && command -v rsvg-convert >/dev/null") != 0) {
    GTEST_SKIP() << "needs gnuplot and rsvg-convert (scripts/setup installs gnuplot-nox and "
                    "librsvg2-bin)";
  }
  const std::string job = WriteJob(std::string(kTinyJob) + "eval: {every_steps: 20}\n");
  Result r = Stagewise("local -q --threads 1 --history " + (dir_ / "a.tsv").string() + " " + job);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string history = Slurp(dir_ / "a.tsv");
  EXPECT_NE(history.find("# stagewise history: tiny (backprop)"), std::string::npos) << history;
  EXPECT_NE(history.find("\ttrain_loss\t"), std::string::npos) << history;
  EXPECT_NE(history.find("20\t"), std::string::npos) << history;
  // A second run to compare with, under its own name.
  std::string other = std::string(kTinyJob) + "eval: {every_steps: 20}\n";
  other.replace(other.find("name: tiny"), 10, "name: tiny_wide");
  other.replace(other.find("hidden: [32]"), 12, "hidden: [64]");
  r = Stagewise("local -q --threads 1 --history " + (dir_ / "b.tsv").string() + " " +
                WriteJob(other));
  ASSERT_EQ(r.code, 0) << r.err;

  const fs::path svg = dir_ / "curves.svg";
  r = Stagewise("plot " + (dir_ / "a.tsv").string() + " " + (dir_ / "b.tsv").string() +
                " --output-file " + svg.string() + " --title 'two runs'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(2 jobs)"), std::string::npos) << r.out;
  const std::string text = Slurp(svg);
  for (const char* want : {"<svg", "two runs", "test accuracy (%)", "wall time (s)", "step",
                           "tiny (backprop)", "tiny_wide (backprop)"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want;
  }
  const fs::path png = dir_ / "curves.png";
  ASSERT_EQ(std::system(("rsvg-convert -o " + png.string() + " " + svg.string()).c_str()), 0);
  const std::string bytes = Slurp(png);
  ASSERT_GT(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  EXPECT_EQ(PngDimension(bytes, 16), 1200u);
  EXPECT_EQ(PngDimension(bytes, 20), 800u);
  // gnuplot writes PNG itself too.
  r = Stagewise("plot " + (dir_ / "a.tsv").string() + " --output-file " +
                (dir_ / "direct.png").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Slurp(dir_ / "direct.png").substr(1, 3), "PNG");

  // Errors name what is wrong.
  r = Stagewise("plot " + (dir_ / "a.tsv").string() + " --output-file " +
                (dir_ / "c.jpg").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("must be a .svg or a .png file"), std::string::npos) << r.err;
  std::ofstream(dir_ / "notes.txt") << "1 2 3\n";
  r = Stagewise("plot " + (dir_ / "notes.txt").string() + " --output-file " + svg.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("notes.txt:1: expected step<TAB>seconds<TAB>name<TAB>value"),
            std::string::npos)
      << r.err;
}

}  // namespace

namespace {

// Pipeline timelines: `local --trace/--timeline` on three worker processes
// whose clocks are an hour off (a test hook), then `trace` on the file.
TEST_F(Cli, TheTimelineLandsOnTheCoordinatorsClockAndTheSvgRenders) {
  std::string yaml = kTinyRevNet;
  yaml.replace(yaml.find("algorithm: backprop"), 19, "algorithm: petra");
  yaml.replace(yaml.find("stages: {count: 2, partition: auto}"), 35, "stages: 3");
  yaml.replace(yaml.find("steps: 2"), 8, "steps: 6");
  const fs::path json = dir_ / "t.json", svg = dir_ / "t.svg";
  const auto now_us = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const int64_t before = now_us();
  Result r = Stagewise("local --threads 1 --trace " + json.string() + " --timeline " +
                           svg.string() + " " + WriteJob(yaml),
                       "STAGEWISE_TEST_CLOCK_SKEW_US=3600000000");
  ASSERT_EQ(r.code, 0) << r.err;
  // The summary, per stage.
  EXPECT_NE(r.err.find("tiny-revnet (petra), mini-batches 0-5: 3 stages"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("wait_prev"), std::string::npos) << r.err;
  const TraceFile trace = ReadTrace(json);
  CheckTrace(trace, 3, "petra", true);
  // The workers' clocks say an hour later; the trace is on the coordinator's.
  EXPECT_GE(trace.origin_unix_us, before - 60'000'000);
  EXPECT_LE(trace.origin_unix_us, now_us() + 60'000'000);
  EXPECT_GE(trace.clock_rtt_us, 0);

  // The same picture again from the file; a real renderer draws it.
  const std::string drawn = Slurp(svg);
  for (const char* want : {"<svg", "stage 0", "stage 2", "tiny-revnet (petra)", "forward",
                           "waiting for stage j+1", "time (ms"}) {
    EXPECT_NE(drawn.find(want), std::string::npos) << want;
  }
  r = Stagewise("trace " + json.string() + " --svg " + (dir_ / "again.svg").string() +
                " --output-file " + (dir_ / "again.json").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Slurp(dir_ / "again.svg"), drawn);
  EXPECT_EQ(Slurp(dir_ / "again.json"), Slurp(json));
  if (std::system("command -v rsvg-convert >/dev/null") == 0) {
    const fs::path png = dir_ / "t.png";
    ASSERT_EQ(std::system(("rsvg-convert -o " + png.string() + " " + svg.string()).c_str()), 0);
    const std::string bytes = Slurp(png);
    ASSERT_GT(bytes.size(), 24u);
    EXPECT_EQ(bytes.substr(1, 3), "PNG");
    EXPECT_EQ(PngDimension(bytes, 16), 1202u);
  }

  // Errors name what is wrong.
  std::ofstream(dir_ / "bad.json") << "{\"traceEvents\": [";
  r = Stagewise("trace " + (dir_ / "bad.json").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("bad.json: not JSON"), std::string::npos) << r.err;
  std::ofstream(dir_ / "other.json") << "{\"a\": 1}";
  r = Stagewise("trace " + (dir_ / "other.json").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no traceEvents list"), std::string::npos) << r.err;
  r = Stagewise("trace " + json.string() + " --svg " + (dir_ / "t.png").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("must end in .svg"), std::string::npos) << r.err;
  r = Stagewise("local --timeline x.png " + WriteJob(yaml));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--timeline x.png: the file must end in .svg"), std::string::npos) << r.err;
}

}  // namespace
