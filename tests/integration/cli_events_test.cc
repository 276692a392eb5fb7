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
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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

using Json = nlohmann::ordered_json;

// What the CLI's YAML means as JSON: a quoted scalar is a string, a plain
// one a boolean, null or number (the CLI quotes every string).
Json FromYaml(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      Json o = Json::object();
      for (const auto& kv : n) o[kv.first.Scalar()] = FromYaml(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      Json a = Json::array();
      for (const auto& item : n) a.push_back(FromYaml(item));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string& v = n.Scalar();
      if (n.Tag() == "!") return v;
      if (v == "true" || v == "false") return v == "true";
      int64_t i;
      if (absl::SimpleAtoi(v, &i)) return i;
      double d;
      if (absl::SimpleAtod(v, &d)) return d;
      return Json("PLAIN STRING " + v);  // never equal to the JSON's value
    }
    default:
      return nullptr;
  }
}

// The job keys docs/cli.md's "Output schema" table lists, in order.
std::vector<std::string> DocumentedJobKeys() {
  std::ifstream in(std::string(STAGEWISE_SOURCE_DIR) + "/docs/cli.md");
  std::vector<std::string> keys;
  std::string line;
  bool in_schema = false;
  const std::regex row(R"(^\| `([a-z_]+)` \|)");
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "### Output schema"))
      in_schema = true;
    else if (in_schema && absl::StartsWith(line, "#"))
      break;
    std::smatch m;
    if (in_schema && std::regex_search(line, m, row)) keys.push_back(m[1]);
  }
  return keys;
}

std::vector<std::string> KeysOf(const Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

TEST_F(CliEventsTest, EveryReadCommandPrintsTheSameValuesAsJsonAndYaml) {
  const std::vector<std::string> documented = DocumentedJobKeys();
  ASSERT_GE(documented.size(), 30u) << "docs/cli.md: no Output schema table";
  EXPECT_EQ(documented.front(), "schema_version");
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  const std::string ckpt = (dir_ / "checkpoints").string();
  const std::string job = R"(seed: 1
model: {name: mlp, hidden: [16]}
data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 4, 4], classes: 4}
optimizer: {name: sgd, lr: 0.05}
batch_size: 32
steps: 6
)";
  // A name YAML would read as a float, a job that ends, and one that cannot
  // be placed (no worker has its label): PENDING, with no loss yet.
  auto done = cluster.manager().Submit(absl::StrCat("name: \".inf\"\n", job,
                                                    "stages: {count: 2}\ncheckpoint: {dir: ", ckpt,
                                                    ", every_steps: 3}\n"));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_TRUE(cluster.WaitForState(*done, v1::SUCCEEDED, absl::Seconds(120)));
  auto pending = cluster.manager().Submit(absl::StrCat(
      "name: waiting\n", job, "stages: {count: 2}\n", "placement: {labels: [gpu=none]}\n"));
  ASSERT_TRUE(pending.ok()) << pending.status();
  const std::string at = " --coordinator " + cluster.coordinator_address() + " ";
  const std::string job_file = (dir_ / "job.yaml").string();
  std::ofstream(job_file) << "name: \".inf\"\n" << job << "stages: {count: 2}\n";

  // `timed`: two runs of a command that measures time differ in these keys.
  const auto both = [&](const std::string& command, bool timed = false) {
    Result json = Stagewise(command + " -o json");
    Result yaml = Stagewise(command + " -o yaml");
    EXPECT_EQ(json.code, 0) << command << ": " << json.err;
    EXPECT_EQ(yaml.code, 0) << command << ": " << yaml.err;
    const Json from_json = Json::parse(json.out, nullptr, false);
    EXPECT_FALSE(from_json.is_discarded()) << command << ": " << json.out;
    Json from_yaml;
    try {
      from_yaml = FromYaml(YAML::Load(yaml.out));
    } catch (const YAML::Exception& e) {
      ADD_FAILURE() << command << ": " << e.what() << "\n" << yaml.out;
    }
    Json compared = from_json;
    if (timed) {
      for (Json* j : {&compared, &from_yaml}) {
        for (const char* key : {"seconds", "samples_per_second", "tokens_per_second"}) {
          if (j->is_object()) j->erase(key);
        }
      }
    }
    EXPECT_EQ(compared, from_yaml) << command << "\nJSON: " << json.out << "\nYAML: " << yaml.out;
    return from_json;
  };

  const Json status = both("status " + *done + at);
  EXPECT_EQ(KeysOf(status), documented);
  EXPECT_EQ(status["schema_version"], 1);
  EXPECT_EQ(status["name"], ".inf");  // a string, in YAML too (compared above)
  EXPECT_EQ(status["state"], "SUCCEEDED");
  EXPECT_TRUE(status["train_loss"].is_number()) << status.dump();
  EXPECT_EQ(status["last_checkpoint_step"], 6);

  const Json waiting = both("status " + *pending + at);
  EXPECT_EQ(KeysOf(waiting), documented);
  EXPECT_EQ(waiting["state"], "PENDING");
  EXPECT_EQ(waiting["step"], 0);
  EXPECT_TRUE(waiting["train_loss"].is_null()) << waiting.dump();
  EXPECT_TRUE(waiting["samples_per_second"].is_null()) << waiting.dump();
  EXPECT_TRUE(waiting["eval_accuracy"].is_null()) << waiting.dump();
  EXPECT_TRUE(waiting["reason"].is_string()) << waiting.dump();  // why it waits

  const Json list = both("list" + at);
  ASSERT_EQ(list.size(), 2u) << list.dump();
  for (const Json& j : list) EXPECT_EQ(KeysOf(j), documented);
  EXPECT_EQ(both("watch " + *done + at)["job_id"], *done);
  const Json workers = both("workers" + at);
  ASSERT_EQ(workers.size(), 2u) << workers.dump();
  EXPECT_TRUE(workers[0]["labels"].is_object());
  const Json checkpoints = both("checkpoints " + *done + at);
  EXPECT_EQ(checkpoints["checkpoints"].size(), 2u) << checkpoints.dump();
  EXPECT_GE(both("events " + *done + at)["events"].size(), 3u);
  EXPECT_EQ(both("validate " + job_file)["job"], ".inf");

  // train-local prints the same schema (what one process knows).
  const Json local = both("train-local -q --threads 1 " + job_file, /*timed=*/true);
  EXPECT_EQ(KeysOf(local), documented);
  EXPECT_TRUE(local["job_id"].is_null());
  EXPECT_EQ(local["name"], ".inf");
  EXPECT_EQ(local["step"], 6);
  EXPECT_TRUE(local["eval_accuracy"].is_number()) << local.dump();
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

// `submit --suspended` (an external queue owns admission): the job waits
// PENDING while workers idle, `resume` queues it, it runs to its end; a
// second `resume` is an error naming its state; the log has the release.
TEST_F(CliEventsTest, ASuspendedJobRunsOnlyOnceResumed) {
  testing::Cluster cluster({.workers = 1});
  ASSERT_TRUE(cluster.WaitForWorkers(1));
  const std::string at = " --coordinator " + cluster.coordinator_address() + " ";
  {
    std::ofstream job(dir_ / "job.yaml");
    job << "name: held\nseed: 1\nmodel: {name: mlp, hidden: [16]}\n"
           "data: {dataset: synthetic, train_size: 64, test_size: 32, shape: [1, 4, 4], "
           "classes: 4}\noptimizer: {name: sgd, lr: 0.05}\nbatch_size: 32\nsteps: 4\n";
  }
  Result submitted = Stagewise("submit --suspended job.yaml" + at);
  ASSERT_EQ(submitted.code, 0) << submitted.err;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  EXPECT_NE(submitted.err.find("suspended"), std::string::npos) << submitted.err;
  // A job of two stages cannot be placed on the one worker: it heads the queue.
  Result blocked = Stagewise("submit --no-wait job.yaml --set stages=2" + at);
  ASSERT_EQ(blocked.code, 0) << blocked.err;
  const std::string big = blocked.out.substr(0, blocked.out.find('\n'));
  usleep(500 * 1000);  // time to be placed, were it queued
  Result status = Stagewise("status " + id + at + "-o json");
  ASSERT_EQ(status.code, 0) << status.err;
  nlohmann::json st = nlohmann::json::parse(status.out);
  EXPECT_EQ(st["state"], "PENDING") << status.out;
  EXPECT_EQ(st["suspended"], true) << status.out;
  Result queue = Stagewise("queue -o json" + at);
  ASSERT_EQ(queue.code, 0) << queue.err;
  nlohmann::json q = nlohmann::json::parse(queue.out)["jobs"];
  ASSERT_EQ(q.size(), 2u) << queue.out;
  EXPECT_EQ(q[0]["job_id"], big) << queue.out;
  EXPECT_EQ(q[0]["position"], 1) << queue.out;
  EXPECT_EQ(q[0]["workers"], 2) << queue.out;
  EXPECT_NE(q[0]["reason"].get<std::string>().find("waiting for 2 idle workers"), std::string::npos)
      << queue.out;
  EXPECT_EQ(q[1]["job_id"], id) << queue.out;
  EXPECT_TRUE(q[1]["position"].is_null()) << queue.out;
  EXPECT_EQ(q[1]["suspended"], true) << queue.out;
  Result table = Stagewise("queue" + at);
  EXPECT_NE(table.out.find("suspended"), std::string::npos) << table.out;

  Result resumed = Stagewise("resume " + id + at);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("released into the queue"), std::string::npos) << resumed.out;
  auto done = cluster.WaitForJob(id);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_FALSE(done->suspended());

  // Released behind the blocked job, it was backfilled on the idle worker.
  ASSERT_EQ(Stagewise("cancel " + big + at).code, 0);
  Result again = Stagewise("resume " + id + at);
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("SUCCEEDED"), std::string::npos) << again.err;
  Result events;
  for (int i = 0; i < 100; ++i) {
    events = Stagewise("events " + id + at);
    if (absl::StrContains(events.out, "released from suspension")) break;
    usleep(50 * 1000);
  }
  EXPECT_NE(events.out.find("released from suspension"), std::string::npos) << events.out;

  // Goodput: the finished job's and the cluster's, as JSON and text.
  Result job_goodput = Stagewise("goodput " + id + at + "-o json");
  ASSERT_EQ(job_goodput.code, 0) << job_goodput.err;
  nlohmann::json g = nlohmann::json::parse(job_goodput.out);
  EXPECT_EQ(g["job_id"], id) << job_goodput.out;
  EXPECT_GT(g["held_worker_seconds"].get<double>(), 0) << job_goodput.out;
  EXPECT_GT(g["worker_seconds"]["startup"].get<double>(), 0) << job_goodput.out;
  EXPECT_TRUE(g["worker_seconds"].contains("productive")) << job_goodput.out;
  Result cluster_goodput = Stagewise("goodput" + at);
  ASSERT_EQ(cluster_goodput.code, 0) << cluster_goodput.err;
  EXPECT_NE(cluster_goodput.out.find("idle_unqueued"), std::string::npos) << cluster_goodput.out;
  EXPECT_NE(cluster_goodput.out.find("goodput "), std::string::npos) << cluster_goodput.out;
  // An ended job keeps its class; the error names the key.
  Result priority = Stagewise("priority " + id + " urgent" + at);
  EXPECT_EQ(priority.code, 1);
  EXPECT_NE(priority.err.find("priority: job " + id + " is SUCCEEDED"), std::string::npos)
      << priority.err;
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
    // Every job and owner is in it: the owner's to read, no one else's.
    EXPECT_EQ(fs::status(dir_ / "backup.db").permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
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

TEST_F(CliEventsTest, CompletionOffersTheCoordinatorsJobIdsInBash) {
  for (const char* shell : {"bash", "zsh", "fish"}) {
    Result r = Stagewise(absl::StrCat("completion ", shell));
    EXPECT_EQ(r.code, 0) << shell << ": " << r.err;
    EXPECT_NE(r.out.find("__complete"), std::string::npos) << r.out;
  }
  EXPECT_EQ(Stagewise("completion tcsh").code, 2);
  Result syntax = Stagewise("completion bash > completion.sh && bash -n completion.sh");
  EXPECT_EQ(syntax.code, 0) << syntax.err;

  testing::Cluster cluster({.workers = 0});
  auto id = cluster.manager().Submit(R"(name: waits
model: {name: mlp, hidden: [16]}
data: {dataset: synthetic, train_size: 64, test_size: 32, shape: [1, 4, 4], classes: 4}
batch_size: 16
steps: 2
)");
  ASSERT_TRUE(id.ok()) << id.status();
  // The binary itself, then bash through the script (the binary on PATH).
  Result direct =
      Stagewise("__complete --coordinator " + cluster.coordinator_address() + " status job-");
  EXPECT_EQ(direct.code, 0) << direct.err;
  EXPECT_EQ(direct.out, absl::StrCat("words\n", *id, "\n"));
  std::ofstream(dir_ / "tab.sh") << "source completion.sh\n"
                                 << "COMP_WORDS=(stagewise status '')\nCOMP_CWORD=2\n"
                                 << "_stagewise\necho \"${COMPREPLY[*]}\"\n";
  Result tab = Stagewise("completion bash > completion.sh && PATH=" STAGEWISE_BINARY_DIR
                         "/bin:$PATH STAGEWISE_CONFIG=none.yaml STAGEWISE_COORDINATOR=" +
                         cluster.coordinator_address() + " bash tab.sh");
  EXPECT_EQ(tab.code, 0) << tab.err;
  EXPECT_EQ(tab.out, *id + "\n") << tab.err;
  Result formats = Stagewise("__complete list -o ''");
  EXPECT_EQ(formats.out, "words\ntext\njson\nyaml\n");
}

}  // namespace
}  // namespace stagewise
