// The `stagewise` binary's shared conventions against a real coordinator (an
// in-process cluster): `events` with every output format, an unknown command,
// an old spelling that still works with a note, and the version handshake (a
// client of another version line is refused, naming both).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/client/coordinator_client.h"
#include "services/common/version.h"
#include "tests/integration/cluster.h"

namespace stagewise {
namespace {
namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out, err;
};

class CliEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("stagewise_cli_events_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `env`: VAR=value words before the binary. The CLI's config file is the
  // test's own unless `env` names another (a user's contexts must not count).
  Result Stagewise(const std::string& args, const std::string& env = "") {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd = absl::StrCat(
        "cd ", dir_.string(), " && TZ=UTC STAGEWISE_CONFIG=", (dir_ / "none.yaml").string(), " ",
        env, STAGEWISE_BINARY_DIR, "/bin/stagewise ", args, " >", out.string(), " 2>", err.string(),
        " </dev/null");
    const int status = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }
  static std::string Slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  fs::path dir_;
};

TEST_F(CliEventsTest, EventsListsTheJobsLogInEveryFormat) {
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  const std::string ckpt = (dir_ / "checkpoints").string();
  auto id = cluster.manager().Submit(absl::StrCat(R"(name: events
seed: 1
model: {name: mlp, hidden: [16]}
data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 4, 4], classes: 4}
optimizer: {name: sgd, lr: 0.05}
batch_size: 32
steps: 12
stages: {count: 2}
checkpoint: {dir: )",
                                                  ckpt, R"(, every_steps: 5}
)"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  const std::string at = " --coordinator " + cluster.coordinator_address() + " ";

  // Notes reach the log with the batched progress: wait for the second commit's.
  Result yaml;
  for (int i = 0; i < 100; ++i) {
    yaml = Stagewise("events " + *id + at + "-o yaml");
    if (absl::StrContains(yaml.out, "checkpoint at step 10 committed")) break;
    usleep(50 * 1000);
  }
  ASSERT_EQ(yaml.code, 0) << yaml.err;
  const YAML::Node doc = YAML::Load(yaml.out);
  EXPECT_EQ(doc["job_id"].as<std::string>(), *id);
  const YAML::Node events = doc["events"];
  ASSERT_GE(events.size(), 4u) << yaml.out;
  EXPECT_TRUE(events[0]["from"].IsNull()) << yaml.out;
  EXPECT_EQ(events[0]["to"].as<std::string>(), "PENDING");
  EXPECT_EQ(events[0]["reason"].as<std::string>(), "submitted");
  bool committed = false, running = false;
  int64_t last_ms = 0;
  for (const YAML::Node& e : events) {
    EXPECT_GE(e["unix_ms"].as<int64_t>(), last_ms) << "not oldest first:\n" << yaml.out;
    last_ms = e["unix_ms"].as<int64_t>();
    const std::string reason = e["reason"].as<std::string>();
    if (e["note"].as<bool>()) {
      EXPECT_EQ(e["from"].as<std::string>(), e["to"].as<std::string>());
      committed |= reason == "checkpoint at step 5 committed";
    } else {
      running |= e["to"].as<std::string>() == "RUNNING";
    }
  }
  EXPECT_TRUE(committed) << yaml.out;
  EXPECT_TRUE(running) << yaml.out;
  // The job's end is its last transition.
  std::string last_to;
  for (const YAML::Node& e : events) {
    if (!e["note"].as<bool>()) last_to = e["to"].as<std::string>();
  }
  EXPECT_EQ(last_to, "SUCCEEDED") << yaml.out;

  Result json = Stagewise("events " + *id + at + "-o json");
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_EQ(YAML::Load(json.out)["events"].size(), events.size()) << json.out;

  Result text = Stagewise("events " + *id + at);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("TIME"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("-> PENDING"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("(RUNNING)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("RUNNING -> SUCCEEDED"), std::string::npos) << text.out;

  Result unknown = Stagewise("events no-such-job" + at);
  EXPECT_EQ(unknown.code, 1) << unknown.err;  // NOT_FOUND, as `status`
  EXPECT_NE(unknown.err.find("no-such-job"), std::string::npos) << unknown.err;

  // -o yaml on another command: the status as YAML.
  Result status = Stagewise("status " + *id + at + "-o yaml");
  ASSERT_EQ(status.code, 0) << status.err;
  EXPECT_EQ(YAML::Load(status.out)["state"].as<std::string>(), "SUCCEEDED") << status.out;

  // The old `trace -o FILE` still writes the file, with a note.
  Result trace = Stagewise("trace " + *id + at + "-o old.json");
  EXPECT_NE(trace.err.find("deprecated"), std::string::npos) << trace.err;
  EXPECT_NE(trace.err.find("--output-file"), std::string::npos) << trace.err;
}

TEST_F(CliEventsTest, AClientOfAnotherVersionLineIsRefusedNamingBoth) {
  testing::Cluster cluster({.workers = 0});
  rpc::RpcOptions other;
  other.client_version = "9.0.0";
  client::CoordinatorClient newer(cluster.coordinator_address(), absl::Seconds(10), other);
  auto jobs = newer.ListJobs();
  ASSERT_EQ(jobs.status().code(), absl::StatusCode::kFailedPrecondition) << jobs.status();
  EXPECT_NE(jobs.status().message().find(
                absl::StrCat("this client runs stagewise 9.0.0 and this coordinator ", Version())),
            std::string::npos)
      << jobs.status();
  // This build's own client (and the CLI, which sends the same) is served.
  client::CoordinatorClient same(cluster.coordinator_address(), absl::Seconds(10),
                                 rpc::RpcOptions{});
  EXPECT_TRUE(same.ListJobs().ok());
  Result cli = Stagewise("list --coordinator " + cluster.coordinator_address());
  EXPECT_EQ(cli.code, 0) << cli.err;
}

TEST_F(CliEventsTest, AContextSaysWhereTheCoordinatorIs) {
  testing::Cluster cluster({.workers = 0});
  const std::string config = "STAGEWISE_CONFIG=" + (dir_ / "config.yaml").string() + " ";
  Result set =
      Stagewise("config set-context here --coordinator " + cluster.coordinator_address(), config);
  ASSERT_EQ(set.code, 0) << set.err;
  EXPECT_NE(set.out.find("created context here (current)"), std::string::npos) << set.out;
  // No --coordinator, no STAGEWISE_COORDINATOR: the context's.
  Result list = Stagewise("list", config + "STAGEWISE_COORDINATOR= ");
  EXPECT_EQ(list.code, 0) << list.err;
  // A flag wins over the context.
  Result elsewhere = Stagewise("list --coordinator 127.0.0.1:1", config);
  EXPECT_EQ(elsewhere.code, 3) << elsewhere.err;
  Result unknown = Stagewise("list --context nosuch", config);
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("context 'nosuch' is not in"), std::string::npos) << unknown.err;
}

TEST_F(CliEventsTest, ABackupTakenWhileAJobRunsRestoresToACoordinatorThatListsIt) {
  const std::string db = (dir_ / "coordinator.db").string();
  std::string id;
  {
    testing::Cluster cluster({.workers = 2, .db = db});
    ASSERT_TRUE(cluster.WaitForWorkers(2));
    auto submitted = cluster.manager().Submit(R"(name: long
seed: 1
model: {name: mlp, hidden: [16]}
data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 4, 4], classes: 4}
optimizer: {name: sgd, lr: 0.05}
batch_size: 32
steps: 10000000
stages: {count: 2}
)");
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    id = *submitted;
    ASSERT_TRUE(cluster.WaitForState(id, v1::RUNNING));
    const std::string at = " --coordinator " + cluster.coordinator_address();
    Result backup = Stagewise("admin backup backup.db" + at);
    ASSERT_EQ(backup.code, 0) << backup.err;
    EXPECT_NE(backup.out.find("backed up the coordinator's database to backup.db"),
              std::string::npos)
        << backup.out;
    Result again = Stagewise("admin backup backup.db" + at);
    EXPECT_NE(again.code, 0);
    EXPECT_NE(again.err.find("exists"), std::string::npos) << again.err;
    ASSERT_TRUE(cluster.manager().Cancel(id, "test over").ok());
  }
  // Restore: a coordinator started on the copy lists the job, as it was when
  // the copy was taken (running: it recovers it, here onto no workers).
  testing::Cluster restored({.workers = 0, .db = (dir_ / "backup.db").string()});
  auto job = restored.manager().GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "long");
  EXPECT_NE(job->state(), v1::CANCELLED) << "the copy is from before the cancel";
  bool listed = false;
  auto jobs = restored.manager().ListJobs(0);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  for (const v1::JobStatus& j : *jobs) listed |= j.job_id() == id;
  EXPECT_TRUE(listed);
}

TEST_F(CliEventsTest, AnUnknownCommandIsAnErrorNamingTheClosestOne) {
  Result r = Stagewise("evnets job-1 --help");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown command 'evnets'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'events'?"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;  // no help printed as if it had worked
  Result far = Stagewise("--coordinator 127.0.0.1:1 xyzzy");
  EXPECT_EQ(far.code, 2);
  EXPECT_NE(far.err.find("unknown command 'xyzzy'"), std::string::npos) << far.err;
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
  // Inside commands that have commands too, --help or not.
  Result deep = Stagewise("config use-contex prod");
  EXPECT_EQ(deep.code, 2);
  EXPECT_NE(deep.err.find("unknown command 'config use-contex'; did you mean 'config "
                          "use-context'?"),
            std::string::npos)
      << deep.err;
  Result help = Stagewise("admin nosuch --help");
  EXPECT_EQ(help.code, 2);
  EXPECT_NE(help.err.find("unknown command 'admin nosuch'"), std::string::npos) << help.err;
  EXPECT_NE(help.err.find("stagewise admin --help"), std::string::npos) << help.err;
  EXPECT_TRUE(help.out.empty()) << help.out;
}

TEST_F(CliEventsTest, CompletionScriptLoadsInBash) {
  Result r = Stagewise("completion bash > completion.sh && bash -n completion.sh && echo ok");
  EXPECT_EQ(r.code, 0) << r.err;
  Result zsh = Stagewise("completion zsh");
  EXPECT_EQ(zsh.code, 0) << zsh.err;
  EXPECT_NE(zsh.out.find("bashcompinit"), std::string::npos);
  Result fish = Stagewise("completion fish");
  EXPECT_EQ(fish.code, 2);
}

}  // namespace
}  // namespace stagewise
