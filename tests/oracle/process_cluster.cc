#include "tests/oracle/process_cluster.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "services/checkpoint/checkpoint.h"
#include "services/models/model.h"
#include "services/rpc/pki.h"
#include "services/rpc/tls.h"
#include "services/spec/job_spec.h"

namespace stagewise::testing {
namespace fs = std::filesystem;

namespace {

std::string MakeTempDir() {
  std::string templ = (fs::temp_directory_path() / "stagewise_cluster_XXXXXX").string();
  if (::mkdtemp(templ.data()) == nullptr) return "";
  return templ;
}

}  // namespace

namespace {

ProcessCluster::Options WorkersWithTimeout(int workers, double heartbeat_timeout_s) {
  ProcessCluster::Options o;
  o.workers = workers;
  o.heartbeat_timeout_s = heartbeat_timeout_s;
  return o;
}

}  // namespace

ProcessCluster::ProcessCluster(int workers, double heartbeat_timeout_s)
    : ProcessCluster(WorkersWithTimeout(workers, heartbeat_timeout_s)) {}

ProcessCluster::ProcessCluster(Options options) : options_(std::move(options)) {
  dir_ = MakeTempDir();
  if (dir_.empty()) {
    error_ = absl::InternalError("mkdtemp failed");
    return;
  }
  bin_ = std::string(STAGEWISE_BINARY_DIR) + "/bin";
  if (options_.tls) {
    error_ = rpc::CreateLocalPki(pki_dir());
    if (!error_.ok()) return;
  }
  if (!options_.tokens.empty()) {
    std::ofstream(dir_ + "/tokens") << options_.tokens;
    ::chmod((dir_ + "/tokens").c_str(), 0600);
  }
  error_ = StartCoordinator();
  if (!error_.ok()) return;
  rpc::RpcOptions client_options = RpcOptionsFor("client");
  client_options.bearer_token = options_.client_token;
  client_ = std::make_unique<::stagewise::client::CoordinatorClient>(
      coordinator_address(), absl::Seconds(10), client_options);
  const std::string metrics_listen = options_.metrics ? "127.0.0.1:0" : "";
  for (int i = 0; i < options_.workers; ++i) {
    const std::string name = absl::StrCat("w", i);
    worker_port_files_.push_back(absl::StrCat(dir_, "/", name, ".port"));
    worker_argv_.push_back({bin_ + "/stagewise-worker", "--coordinator", coordinator_address(),
                            "--listen", "127.0.0.1:0", "--advertise", "127.0.0.1",
                            "--metrics-listen", metrics_listen, "--name", name, "--threads", "1",
                            "--port-file", worker_port_files_.back(), "--log-level", "warning",
                            // Jobs may read and checkpoint under the cluster's directory only.
                            "--data-root", dir_, "--checkpoint-root", dir_});
    // One certificate per worker (worker-<i>): a job's stages go to distinct
    // identities (placement.distinct_identities).
    if (options_.tls) {
      error_ = rpc::IssueLocalIdentity(pki_dir(), absl::StrCat("worker-", i));
      if (!error_.ok()) return;
    }
    for (const std::string& flag : TlsFlags(absl::StrCat("worker-", i))) {
      worker_argv_.back().push_back(flag);
    }
    for (const std::string& flag : options_.worker_args) {
      worker_argv_.back().push_back(absl::StrReplaceAll(flag, {{"{i}", absl::StrCat(i)}}));
    }
    workers_.emplace_back();
    worker_ports_.emplace_back();
    error_ = StartWorker(i);
    if (!error_.ok()) return;
  }
  error_ = WaitForWorkers(options_.workers);
}

std::vector<std::string> ProcessCluster::TlsFlags(const std::string& identity) const {
  if (!options_.tls) return {"--insecure"};
  const rpc::TlsConfig c = rpc::TlsConfigFor(pki_dir(), identity);
  std::vector<std::string> flags = {"--tls-cert", c.cert_file, "--tls-key",
                                    c.key_file,   "--tls-ca",  c.ca_file};
  if (options_.tls_reload_seconds > 0) {
    flags.push_back("--tls-reload-seconds");
    flags.push_back(std::to_string(options_.tls_reload_seconds));
  }
  return flags;
}

rpc::RpcOptions ProcessCluster::RpcOptionsFor(const std::string& identity) const {
  rpc::RpcOptions options;
  if (options_.tls) {
    rpc::TlsConfig config = rpc::TlsConfigFor(pki_dir(), identity);
    if (options_.tls_reload_seconds > 0) config.reload_seconds = options_.tls_reload_seconds;
    absl::Status s = rpc::ApplyTls(config, &options);
    if (!s.ok()) ADD_FAILURE() << s;
  }
  return options;
}

std::string ProcessCluster::coordinator_address() const {
  return absl::StrCat("127.0.0.1:", coordinator_port_);
}

ProcessCluster::~ProcessCluster() {
  std::vector<cli::Child*> all;
  for (auto& w : workers_) {
    if (w) all.push_back(w.get());
  }
  if (coordinator_) all.push_back(coordinator_.get());
  cli::TerminateAll(all, absl::Seconds(10));
  workers_.clear();
  coordinator_.reset();
  client_.reset();
  if (!dir_.empty() && ::getenv("STAGEWISE_KEEP_TEST_DIRS") == nullptr) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

absl::Status ProcessCluster::StartCoordinator() {
  const std::string port_file = dir_ + "/coordinator.port";
  fs::remove(port_file);
  std::vector<std::string> argv = {bin_ + "/stagewise-coordinator",
                                   "--listen",
                                   absl::StrCat("127.0.0.1:", coordinator_port_),
                                   "--metrics-listen",
                                   options_.metrics ? "127.0.0.1:0" : "",
                                   "--db",
                                   dir_ + "/coordinator.db",
                                   "--port-file",
                                   port_file,
                                   "--heartbeat-timeout",
                                   absl::StrCat(options_.heartbeat_timeout_s),
                                   "--log-level",
                                   "warning",
                                   "--checkpoint-root",
                                   dir_};
  argv.insert(argv.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
  for (const std::string& flag : TlsFlags("coordinator")) argv.push_back(flag);
  if (!options_.tokens.empty()) {
    argv.push_back("--tokens");
    argv.push_back(dir_ + "/tokens");
  }
  auto child = cli::Child::Spawn(argv, dir_ + "/coordinator.log");
  if (!child.ok()) return child.status();
  coordinator_ = std::move(*child);
  auto ports = cli::WaitForPortFile(port_file, absl::Seconds(60), *coordinator_);
  if (!ports.ok()) {
    return absl::Status(ports.status().code(), absl::StrCat(ports.status().message(), "\n",
                                                            cli::TailFile(CoordinatorLog(), 30)));
  }
  coordinator_port_ = ports->grpc;
  coordinator_metrics_port_ = ports->metrics;
  return absl::OkStatus();
}

absl::Status ProcessCluster::StartWorker(int i) { return StartWorkers({i}); }

absl::Status ProcessCluster::StartWorkers(const std::vector<int>& which) {
  for (int i : which) {
    fs::remove(worker_port_files_[i]);
    auto child = cli::Child::Spawn(worker_argv_[i], absl::StrCat(dir_, "/w", i, ".log"));
    if (!child.ok()) return child.status();
    workers_[i] = std::move(*child);
  }
  for (int i : which) {
    auto ports = cli::WaitForPortFile(worker_port_files_[i], absl::Seconds(60), *workers_[i]);
    if (!ports.ok()) {
      return absl::Status(ports.status().code(), absl::StrCat(ports.status().message(), "\n",
                                                              cli::TailFile(WorkerLog(i), 30)));
    }
    worker_ports_[i] = *ports;
  }
  return absl::OkStatus();
}

absl::Status ProcessCluster::KillWorker(int i) {
  if (!workers_[i]) return absl::FailedPreconditionError("not running");
  workers_[i]->Signal(SIGKILL);
  absl::Status s = workers_[i]->Terminate(absl::Seconds(10));  // reaps it
  workers_[i].reset();
  return s;
}

absl::StatusOr<std::string> ProcessCluster::TerminateWorker(int i, absl::Duration wait) {
  if (!workers_[i]) return absl::FailedPreconditionError("not running");
  workers_[i]->Signal(SIGTERM);
  const absl::Time deadline = absl::Now() + wait;
  while (workers_[i]->IsRunning() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  if (workers_[i]->IsRunning()) {
    workers_[i]->Kill();
    workers_[i].reset();
    return absl::DeadlineExceededError(
        absl::StrCat("worker ", i, " still ran ", absl::FormatDuration(wait), " after SIGTERM"));
  }
  std::string how = workers_[i]->DescribeExit();
  workers_[i].reset();
  return how;
}

absl::Status ProcessCluster::KillAndRestartWorker(int i) {
  if (absl::Status s = KillWorker(i); !s.ok()) return s;
  return StartWorker(i);
}

absl::Status ProcessCluster::KillAndRestartCoordinator(absl::Duration down_for) {
  coordinator_->Signal(SIGKILL);
  if (absl::Status s = coordinator_->Terminate(absl::Seconds(10)); !s.ok()) return s;
  coordinator_.reset();
  absl::SleepFor(down_for);
  return StartCoordinator();
}

absl::Status ProcessCluster::WaitForWorkers(int n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    auto workers = client_->ListWorkers();
    if (workers.ok() && static_cast<int>(workers->size()) >= n) return absl::OkStatus();
    if (!workers.ok()) last = workers.status();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("fewer than ", n, " workers registered: ", last.ToString()));
}

absl::StatusOr<v1::JobStatus> ProcessCluster::WaitFor(
    const std::string& job_id, const std::function<bool(const v1::JobStatus&)>& done,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<v1::JobStatus> st = absl::DeadlineExceededError("never asked");
  while (absl::Now() < deadline) {
    st = client_->GetJob(job_id);
    if (st.ok() && (done(*st) || st->state() == v1::SUCCEEDED || st->state() == v1::FAILED ||
                    st->state() == v1::CANCELLED)) {
      return st;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("job ", job_id, " not there after ", absl::FormatDuration(timeout),
                   "; last: ", st.ok() ? st->DebugString() : st.status().ToString()));
}

absl::StatusOr<v1::JobStatus> ProcessCluster::WaitForEnd(const std::string& job_id,
                                                         absl::Duration timeout) {
  return WaitFor(
      job_id, [](const v1::JobStatus&) { return false; }, timeout);
}

std::string ProcessCluster::WorkerLog(int i) const { return absl::StrCat(dir_, "/w", i, ".log"); }
std::string ProcessCluster::CoordinatorLog() const { return dir_ + "/coordinator.log"; }

absl::StatusOr<std::map<std::string, torch::Tensor>> CheckpointTensors(
    const std::string& checkpoint_root, const std::string& job_id, int64_t step) {
  const std::string dir = checkpoint::StepDir(checkpoint_root, job_id, step);
  auto manifest = checkpoint::ReadManifest(dir);
  if (!manifest.ok()) return manifest.status();
  auto spec = ParseJobSpec(manifest->job_spec_yaml());
  if (!spec.ok()) return spec.status();
  std::map<std::string, torch::Tensor> out;
  for (const v1::CheckpointShard& shard : manifest->shards()) {
    const std::string path = dir + "/" + shard.file();
    if (absl::Status s = checkpoint::VerifyFile(path, shard.bytes(), shard.crc32()); !s.ok()) {
      return s;
    }
    auto model = models::BuildModel(spec->model, static_cast<uint64_t>(spec->seed),
                                    shard.block_begin(), shard.block_end());
    if (!model.ok()) return model.status();
    try {
      torch::serialize::InputArchive archive, sub;
      archive.load_from(path);
      archive.read("model", sub);
      (*model)->load(sub);
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
    }
    for (const auto& item : (*model)->named_parameters()) {
      out[item.key()] = item.value().detach().clone();
    }
    for (const auto& item : (*model)->named_buffers()) {
      out[item.key()] = item.value().detach().clone();
    }
  }
  return out;
}

void ProcessCluster::ExpectRunsToSuccess(const std::string& job_spec_yaml, absl::Duration timeout) {
  auto id = client().Submit(job_spec_yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = WaitForEnd(*id, timeout);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason() << "\n" << CoordinatorLog();
}

}  // namespace stagewise::testing
