// `stagewise local`: the embedded mode. Starts a coordinator and J workers as
// child processes on loopback, runs one job through them exactly as `submit`
// would, prints the result and stops every child, also on Ctrl-C and when a
// child dies. With --chaos / --chaos-coordinator it kills and restarts
// children on purpose while the job runs (chaos.h decides when and which).
#include <stdlib.h>
#include <string.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "clients/cli/chaos.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/curves.h"
#include "clients/cli/devices.h"
#include "clients/cli/flags.h"
#include "clients/cli/job_format.h"
#include "clients/cli/job_watch.h"
#include "clients/cli/process.h"
#include "clients/cli/script_job.h"
#include "clients/cli/signal_watcher.h"
#include "clients/cli/timeline.h"
#include "clients/client/coordinator_client.h"
#include "services/checkpoint/checkpoint.h"
#include "services/rpc/pki.h"
#include "services/rpc/tls.h"
#include "services/spec/job_spec.h"

namespace stagewise::cli {
namespace {

constexpr char kCoordinatorBinary[] = "stagewise-coordinator";
constexpr char kWorkerBinary[] = "stagewise-worker";
constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kStopTimeout = absl::Seconds(10);
constexpr int kLogTailLines = 30;

// "SIGINT", "SIGTERM".
std::string SignalName(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signo);
}

struct Proc {
  std::string label;  // "coordinator", "worker local-1"
  std::unique_ptr<Child> child;
  std::vector<std::string> argv;  // to restart it as it was started
  std::string log_path;
  std::string port_file;
  int port = 0;             // its gRPC port once known; a restart binds it again
  bool restarting = false;  // killed on purpose (chaos), being restarted; under mu_
};

class LocalRun {
 public:
  LocalRun(const LocalArgs& args, std::ostream& out, std::ostream& err)
      : args_(args), out_(out), err_(err) {}
  ~LocalRun() { Shutdown(); }

  int Run();

 private:
  // Steps of Run(); those returning int give an exit code, or -1 to go on.
  int PrepareJob();  // the job's text, spec, workers, threads and devices
  int FindBinaries();
  int StartCoordinator();  // and client_
  int StartWorkers(client::CoordinatorClient& client);
  // --history, --trace, --timeline after the job ended with `code`.
  int WriteOutputs(client::CoordinatorClient& client, const std::string& job_id,
                   const v1::JobStatus& result, int code);
  std::vector<std::string> TlsFlags(const std::string& name) const;
  absl::Status MakeDir();
  absl::StatusOr<Proc*> Start(const std::string& label, std::vector<std::string> argv,
                              const std::string& log_name, const std::string& port_file);
  // Chaos: checks that the job can recover (exit code, or -1 to go on) and
  // sets up the schedule.
  int SetUpChaos(const JobSpec& spec, int num_workers);
  // Chaos, on the main thread (the watch's event callback): the kill due now,
  // if any, carried out; returns the lines to print.
  std::vector<std::string> AfterEvent(const v1::JobEvent& event);
  // kill -9 and restart with the same argv (the same --listen port).
  absl::Status KillAndRestart(Proc* proc);

  // On the signal watcher's thread.
  void OnSignal(int signo);
  void OnTick();
  void CancelJobOnce(const std::string& reason);

  // Explains why startup or the watch ended early and returns the exit code:
  // the signal, else a child that died (with its log), else `status` itself
  // with the log of `related` (may be null).
  int Fail(const absl::Status& status, const Proc* related);
  void ReportDeath(const Proc& proc);
  void PrintLogTail(const Proc& proc);
  // --web: the job has ended; the pages stay up for --web-linger (until
  // Ctrl-C by default, or a child dies).
  void KeepServingThePages(const std::string& job_id);
  // A child that is not running, waiting up to `grace` for one to die: a
  // broken stream often arrives a moment before the exit can be reaped.
  const Proc* FindDeadChild(absl::Duration grace);
  void Shutdown();

  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  // What PrepareJob, FindBinaries and StartCoordinator found.
  JobSpec spec_;
  std::string yaml_;  // the job as submitted
  int num_workers_ = 0;
  int threads_ = 0;
  std::vector<std::string> devices_;
  std::string binaries_[2];  // coordinator, worker
  std::vector<std::string> checkpoint_root_, data_root_;
  std::string address_;  // the coordinator's

  std::unique_ptr<ChaosSchedule> chaos_;
  uint64_t chaos_seed_ = 0;
  Proc* coordinator_ = nullptr;  // also in procs_
  std::vector<Proc*> workers_;   // likewise

  const LocalArgs& args_;
  std::ostream& out_;
  std::ostream& err_;
  std::string dir_;
  std::atomic<bool> abort_{false};
  std::unique_ptr<SignalWatcher> signals_;
  bool shut_down_ = false;

  absl::Mutex mu_;
  // Appended only by the main thread before the watch, and only while the
  // signal watcher runs; the Child objects themselves are thread-safe.
  std::vector<std::unique_ptr<Proc>> procs_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<client::CoordinatorClient> client_ ABSL_GUARDED_BY(mu_);
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  bool cancel_sent_ ABSL_GUARDED_BY(mu_) = false;
  const Proc* dead_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status LocalRun::MakeDir() {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  std::string pattern = (base / "stagewise-local-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a temporary directory in ",
                                            base.string(), ": ", ::strerror(errno)));
  }
  dir_ = pattern;
  return absl::OkStatus();
}

absl::StatusOr<Proc*> LocalRun::Start(const std::string& label, std::vector<std::string> argv,
                                      const std::string& log_name, const std::string& port_file) {
  absl::StatusOr<std::unique_ptr<Child>> child = Child::Spawn(argv, Path(log_name));
  if (!child.ok()) return child.status();
  auto proc = std::make_unique<Proc>();
  proc->label = label;
  proc->child = std::move(*child);
  proc->argv = std::move(argv);
  proc->log_path = Path(log_name);
  proc->port_file = port_file;
  Proc* raw = proc.get();
  absl::MutexLock lock(&mu_);
  procs_.push_back(std::move(proc));
  return raw;
}

void LocalRun::CancelJobOnce(const std::string& reason) {
  std::string job_id;
  client::CoordinatorClient* client = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (job_id_.empty() || cancel_sent_ || client_ == nullptr) return;
    cancel_sent_ = true;
    job_id = job_id_;
    client = client_.get();
  }
  // The coordinator may be the child that died: then this fails fast.
  client->Cancel(job_id, reason).IgnoreError();
}

void LocalRun::OnSignal(int signo) {
  abort_ = true;
  CancelJobOnce(absl::StrCat("stagewise local was interrupted (", SignalName(signo), ")"));
  absl::MutexLock lock(&mu_);
  if (client_ != nullptr) client_->StopWatching();
}

void LocalRun::OnTick() {
  const Proc* dead = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || dead_ != nullptr) return;
    for (const auto& p : procs_) {
      if (!p->restarting && !p->child->IsRunning()) {
        dead_ = dead = p.get();
        break;
      }
    }
  }
  if (dead == nullptr) return;
  abort_ = true;
  CancelJobOnce(absl::StrCat("local ", dead->label, " (pid ", dead->child->pid(), ") ",
                             dead->child->DescribeExit()));
  absl::MutexLock lock(&mu_);
  if (client_ != nullptr) client_->StopWatching();
}

const Proc* LocalRun::FindDeadChild(absl::Duration grace) {
  const absl::Time end = absl::Now() + grace;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (dead_ != nullptr) return dead_;
      for (const auto& p : procs_) {
        if (!p->restarting && !p->child->IsRunning()) return dead_ = p.get();
      }
    }
    if (absl::Now() >= end) return nullptr;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void LocalRun::PrintLogTail(const Proc& proc) {
  const std::string tail = TailFile(proc.child->log_path(), kLogTailLines);
  if (tail.empty()) {
    err_ << "(" << proc.child->log_path() << " is empty)\n";
    return;
  }
  err_ << "--- last lines of " << proc.child->log_path() << " ---\n"
       << tail << "\n--- end of " << proc.label << " log ---\n";
}

void LocalRun::ReportDeath(const Proc& proc) {
  err_ << "error: " << proc.label << " (" << proc.child->name() << ", pid " << proc.child->pid()
       << ") died: " << proc.child->DescribeExit() << "\n";
  PrintLogTail(proc);
}

int LocalRun::Fail(const absl::Status& status, const Proc* related) {
  if (const int signo = signals_ ? signals_->first_signal() : 0; signo != 0) {
    std::string cancelled;
    {
      absl::MutexLock lock(&mu_);
      if (cancel_sent_) cancelled = absl::StrCat("cancelled job ", job_id_, "; ");
    }
    err_ << "interrupted (" << SignalName(signo) << "): " << cancelled
         << "stopping the local processes\n";
    return ExitCodeForSignal(signo);
  }
  if (const Proc* dead = FindDeadChild(absl::Seconds(1)); dead != nullptr) {
    ReportDeath(*dead);
    return kExitFailed;
  }
  err_ << "error: " << status.message() << "\n";
  if (related != nullptr) PrintLogTail(*related);
  return kExitFailed;
}

void LocalRun::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  signals_.reset();  // no callback runs after this: the main thread owns everything
  std::vector<Child*> children;
  {
    absl::MutexLock lock(&mu_);
    // All get SIGTERM at once; workers are listed first so that they are
    // signalled before the coordinator they report to.
    for (auto it = procs_.rbegin(); it != procs_.rend(); ++it)
      children.push_back((*it)->child.get());
  }
  for (Child* killed : TerminateAll(children, kStopTimeout)) {
    err_ << "warning: " << killed->name() << " (pid " << killed->pid() << ") did not stop within "
         << absl::FormatDuration(kStopTimeout) << " of SIGTERM and was killed\n";
  }
  {
    absl::MutexLock lock(&mu_);
    client_.reset();
    procs_.clear();
  }
  if (dir_.empty()) return;
  if (args_.keep_logs) {
    err_ << "logs kept in " << dir_ << "\n";
  } else {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

int LocalRun::SetUpChaos(const JobSpec& spec, int num_workers) {
  if (args_.chaos <= 0 && args_.chaos_coordinator <= 0) return -1;
  if (spec.checkpoint.dir.empty()) {
    err_ << "error: --chaos and --chaos-coordinator need checkpoints to recover from, and "
         << args_.job_path << " has no checkpoint.dir; add for example\n"
         << "  checkpoint: {dir: checkpoints, every_steps: 50}\n"
         << "(a relative dir is relative to this directory, where the local processes run)\n";
    return kExitInvalid;
  }
  if (spec.checkpoint.every_steps <= 0 && spec.checkpoint.every_epochs <= 0) {
    err_ << "warning: checkpoint.every_steps and checkpoint.every_epochs are 0: the job takes "
            "no periodic checkpoints, so a recovery may have to start over\n";
  }
  if (args_.chaos > spec.recovery.max_restarts) {
    err_ << "warning: --chaos " << args_.chaos << " kills more workers than recovery.max_restarts ("
         << spec.recovery.max_restarts << ") lets the job recover from: it will probably fail\n";
  }
  chaos_seed_ = args_.chaos_seed;
  std::random_device random;
  while (chaos_seed_ == 0) chaos_seed_ = random();  // 0 means "pick one"
  chaos_ = std::make_unique<ChaosSchedule>(args_.chaos, args_.chaos_coordinator, num_workers,
                                           chaos_seed_);
  return -1;
}

absl::Status LocalRun::KillAndRestart(Proc* proc) {
  {
    absl::MutexLock lock(&mu_);
    proc->restarting = true;  // OnTick must not take this death for a crash
  }
  proc->child->Kill();
  // Restart on the same port, so that the others find it where it was.
  std::vector<std::string> argv = proc->argv;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--listen" && proc->port > 0)
      argv[i + 1] = absl::StrCat("127.0.0.1:", proc->port);
  }
  std::remove(proc->port_file.c_str());
  std::ofstream(proc->log_path, std::ios::app)
      << "=== stagewise local --chaos: killed with signal 9; restarting ===\n";
  absl::StatusOr<std::unique_ptr<Child>> child = Child::Spawn(argv, proc->log_path);
  absl::MutexLock lock(&mu_);
  // On failure the dead child stays: OnTick then reports it like any death.
  if (child.ok()) proc->child = std::move(*child);
  proc->restarting = false;
  return child.status();
}

std::vector<std::string> LocalRun::AfterEvent(const v1::JobEvent& event) {
  if (chaos_ == nullptr || abort_) return {};
  std::optional<ChaosSchedule::Kill> kill = chaos_->Next(event.status());
  if (!kill.has_value()) return {};
  // A worker the job runs on (with more workers than stages, killing an idle
  // one would test nothing), else any.
  std::vector<Proc*> candidates;
  const auto& attempts = event.status().attempts();
  if (!attempts.empty()) {
    const auto& running_on = attempts[attempts.size() - 1].workers();
    for (Proc* w : workers_) {
      const std::string name(absl::StripPrefix(w->label, "worker "));
      if (std::find(running_on.begin(), running_on.end(), name) != running_on.end()) {
        candidates.push_back(w);
      }
    }
  }
  if (candidates.empty()) candidates = workers_;
  Proc* victim = kill->target == ChaosSchedule::Target::kCoordinator
                     ? coordinator_
                     : candidates[static_cast<size_t>(kill->worker) % candidates.size()];
  const pid_t pid = victim->child->pid();
  const absl::Status restarted = KillAndRestart(victim);
  std::string line = absl::StrCat("chaos: killed ", victim->label, " (pid ", pid, ") at step ",
                                  event.status().step(), "; restarting");
  if (!restarted.ok()) absl::StrAppend(&line, " failed: ", restarted.message());
  return {line};
}

int LocalRun::PrepareJob() {
  // The job: parsed here only for its stage count (the coordinator validates
  // it again and is the authority), and sent as written.
  absl::StatusOr<std::string> text = ReadJobText(args_.job_path, args_.sets);
  absl::StatusOr<JobSpec> spec =
      text.ok() ? ParseJobFile(args_.job_path, args_.sets) : text.status();
  if (!spec.ok()) {
    err_ << "error: " << args_.job_path << ": " << spec.status().message() << "\n";
    return spec.status().code() == absl::StatusCode::kInvalidArgument ||
                   spec.status().code() == absl::StatusCode::kNotFound
               ? kExitInvalid
               : kExitFailed;
  }
  spec_ = *std::move(spec);
  yaml_ = *std::move(text);
  if (args_.steps > 0) {
    auto shortened = OverrideSteps(yaml_, args_.steps);
    if (!shortened.ok()) {
      err_ << "error: " << args_.job_path << ": " << shortened.status().message() << "\n";
      return kExitInvalid;
    }
    yaml_ = *std::move(shortened);
  }
  if (absl::Status s = PrepareScriptModel(args_.job_path, &spec_, &yaml_); !s.ok()) {
    err_ << "error: " << args_.job_path << ": " << s.message() << "\n";
    return kExitInvalid;
  }
  if (!args_.timeline.empty() && !absl::EndsWith(args_.timeline, ".svg")) {
    err_ << "error: --timeline " << args_.timeline << ": the file must end in .svg\n";
    return kExitInvalid;
  }
  if (!args_.web.empty() && !rpc::IsLoopbackAddress(args_.web)) {
    err_ << "error: --web: " << args_.web
         << " is not a loopback address (local serves on 127.0.0.1 only)\n";
    return kExitInvalid;
  }
  if ((!args_.trace.empty() || !args_.timeline.empty() || !args_.web.empty()) &&
      !spec_.trace.enabled) {
    // The default window (docs/trace.md), as if the job had asked for it.
    yaml_ += "\ntrace: {}\n";
  }
  // Workers per pipeline (interleaved: each holds chunks_per_worker stages).
  const int stages = spec_.stages.count;
  // Replicated stages (docs/replicas.md): J x R workers.
  num_workers_ =
      args_.workers > 0 ? args_.workers : std::max(1, stages * std::max(1, spec_.stages.replicas));
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  threads_ = args_.threads > 0 ? args_.threads : std::max(1, cores / num_workers_);
  if (const int code = SetUpChaos(spec_, num_workers_); code >= 0) return code;
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  absl::StatusOr<std::vector<std::string>> devices =
      LocalWorkerDevices(spec_.device, args_.devices, num_workers_, gpus);
  if (!devices.ok()) {
    err_ << "error: " << (args_.devices.empty() ? args_.job_path + ": " : std::string())
         << devices.status().message() << "\n";
    return kExitInvalid;
  }
  devices_ = *std::move(devices);
  return -1;
}

int LocalRun::FindBinaries() {
  // The binaries: next to this executable (a build or install tree), then PATH.
  const std::string self_dir = SelfExecutableDir();
  const char* names[2] = {kCoordinatorBinary, kWorkerBinary};
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> found = FindExecutable(names[i], self_dir);
    if (!found.ok()) {
      err_ << "error: " << names[i] << " not found next to "
           << (self_dir.empty() ? std::string("this executable") : self_dir + "/stagewise")
           << " or on PATH\n";
      return kExitFailed;
    }
    binaries_[i] = *found;
  }
  return -1;
}

std::vector<std::string> LocalRun::TlsFlags(const std::string& name) const {
  if (args_.insecure) return {"--insecure"};
  const rpc::TlsConfig c = rpc::TlsConfigFor(Path("tls"), name);
  return {"--tls-cert", c.cert_file, "--tls-key", c.key_file, "--tls-ca", c.ca_file};
}

// `argv` followed by `more`.
std::vector<std::string> With(std::vector<std::string> argv, const std::vector<std::string>& more) {
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

int LocalRun::StartCoordinator() {
  // Mutual TLS on loopback with throw-away certificates (unless --insecure):
  // the same setup as a cluster, so nothing differs but the addresses.
  const std::string pki = Path("tls");
  rpc::RpcOptions client_options;
  if (!args_.insecure) {
    if (absl::Status s = rpc::CreateLocalPki(pki); !s.ok()) return Fail(s, nullptr);
    if (absl::Status s = rpc::ApplyTls(rpc::TlsConfigFor(pki, "client"), &client_options);
        !s.ok()) {
      return Fail(s, nullptr);
    }
  }
  if (!args_.quiet) {
    err_ << (args_.insecure
                 ? std::string("local: --insecure: plaintext on 127.0.0.1\n")
                 : absl::StrCat("local: mutual TLS on 127.0.0.1; throw-away certificates in ", pki,
                                (args_.keep_logs ? "" : " (removed at exit)"), "\n"));
  }
  // The job's own paths are the only ones its processes may use (you are
  // the operator here; a cluster's operator chooses the roots).
  if (!spec_.checkpoint.dir.empty()) checkpoint_root_ = {"--checkpoint-root", spec_.checkpoint.dir};
  if (!spec_.data.path.empty()) data_root_ = {"--data-root", spec_.data.path};
  // A torchscript model: exactly the file the CLI inspected.
  if (!spec_.model.script_file.empty()) {
    data_root_.insert(data_root_.end(), {"--model-root", spec_.model.script_file});
  }
  std::vector<std::string> web;
  if (!args_.web.empty()) web = {"--web-listen", args_.web};
  absl::StatusOr<Proc*> coordinator =
      Start("coordinator",
            With({binaries_[0], "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                  "--db", Path("coordinator.db"), "--port-file", Path("coordinator.port")},
                 With(With(TlsFlags("coordinator"), checkpoint_root_), web)),
            "coordinator.log", Path("coordinator.port"));
  if (!coordinator.ok()) return Fail(coordinator.status(), nullptr);
  coordinator_ = *coordinator;
  absl::StatusOr<Ports> coordinator_ports =
      WaitForPortFile(Path("coordinator.port"), kStartTimeout, *(*coordinator)->child, &abort_);
  if (!coordinator_ports.ok()) return Fail(coordinator_ports.status(), *coordinator);
  coordinator_->port = coordinator_ports->grpc;
  address_ = absl::StrCat("127.0.0.1:", coordinator_ports->grpc);
  absl::MutexLock lock(&mu_);
  client_ =
      std::make_unique<client::CoordinatorClient>(address_, absl::Seconds(10), client_options);
  return -1;
}

int LocalRun::StartWorkers(client::CoordinatorClient& client) {
  // Workers: start them all, then wait for each.
  std::vector<Proc*> workers;
  for (int n = 0; n < num_workers_; ++n) {
    // One certificate per worker: a job's stages go to distinct identities.
    if (!args_.insecure) {
      if (absl::Status s = rpc::IssueLocalIdentity(Path("tls"), absl::StrCat("worker-", n));
          !s.ok()) {
        return Fail(s, nullptr);
      }
    }
    absl::StatusOr<Proc*> worker =
        Start(absl::StrCat("worker local-", n),
              With({binaries_[1], "--coordinator", address_, "--listen", "127.0.0.1:0",
                    "--advertise", "127.0.0.1", "--metrics-listen", "127.0.0.1:0", "--port-file",
                    Path(absl::StrCat("worker-", n, ".port")), "--name", absl::StrCat("local-", n),
                    "--threads", absl::StrCat(threads_), "--device", devices_[n]},
                   With(With(TlsFlags(absl::StrCat("worker-", n)), checkpoint_root_), data_root_)),
              absl::StrCat("worker-", n, ".log"), Path(absl::StrCat("worker-", n, ".port")));
    if (!worker.ok()) return Fail(worker.status(), nullptr);
    workers.push_back(*worker);
  }
  for (int n = 0; n < num_workers_; ++n) {
    absl::StatusOr<Ports> ports = WaitForPortFile(Path(absl::StrCat("worker-", n, ".port")),
                                                  kStartTimeout, *workers[n]->child, &abort_);
    if (!ports.ok()) return Fail(ports.status(), workers[n]);
    workers[n]->port = ports->grpc;
  }
  workers_ = workers;
  absl::Status registered = client.WaitForWorkers(num_workers_, kStartTimeout, [this] {
    return abort_ ? absl::CancelledError("stopped waiting for workers") : absl::OkStatus();
  });
  if (!registered.ok()) return Fail(registered, coordinator_);
  if (!args_.quiet) {
    err_ << "local: coordinator at " << address_ << ", " << num_workers_
         << " worker(s) registered\n";
    if (!args_.web.empty()) {
      err_ << "local: status pages at " << (args_.insecure ? "http" : "https") << "://" << args_.web
           << "/" << (args_.insecure ? "" : " (a throw-away certificate)") << "\n";
    }
  }
  return -1;
}

int LocalRun::WriteOutputs(client::CoordinatorClient& client, const std::string& job_id,
                           const v1::JobStatus& result, int code) {
  if (!args_.history.empty()) {
    absl::Status written = [&]() -> absl::Status {
      absl::StatusOr<v1::JobMetrics> metrics = client.GetJobMetrics(job_id);
      if (!metrics.ok()) return metrics.status();
      return checkpoint::WriteFileAtomically(args_.history,
                                             HistoryText(CurvesFromMetrics(result, *metrics)));
    }();
    if (!written.ok()) {
      err_ << "error: --history " << args_.history << ": " << written.message() << "\n";
      if (code == kExitOk) code = kExitFailed;
    } else if (!args_.quiet) {
      err_ << "local: metric history in " << args_.history << " (stagewise plot " << args_.history
           << " -o curves.svg)\n";
    }
  }
  if (!args_.trace.empty() || !args_.timeline.empty()) {
    absl::Status written = [&]() -> absl::Status {
      absl::StatusOr<v1::JobTrace> trace = client.GetJobTrace(job_id);
      if (!trace.ok()) return trace.status();
      if (!args_.quiet) err_ << TraceSummary(*trace);
      return WriteTraceFiles(*trace, args_.trace, args_.timeline);
    }();
    if (!written.ok()) {
      err_ << "error: --trace/--timeline: " << written.message() << "\n";
      if (code == kExitOk) code = kExitFailed;
    } else if (!args_.quiet) {
      if (!args_.trace.empty()) {
        err_ << "local: pipeline trace in " << args_.trace << " (stagewise trace " << args_.trace
             << " --svg timeline.svg; or open it in ui.perfetto.dev)\n";
      }
      if (!args_.timeline.empty()) err_ << "local: pipeline diagram in " << args_.timeline << "\n";
    }
  }
  return code;
}

int LocalRun::Run() {
  if (const int code = PrepareJob(); code >= 0) return code;
  if (const int code = FindBinaries(); code >= 0) return code;
  if (absl::Status s = MakeDir(); !s.ok()) {
    err_ << "error: " << s.message() << "\n";
    return kExitFailed;
  }
  signals_ =
      std::make_unique<SignalWatcher>([this](int signo) { OnSignal(signo); }, [this] { OnTick(); });
  if (!args_.quiet) {
    err_ << "local: starting a coordinator and " << num_workers_ << " worker(s) (" << threads_
         << " thread(s) each, on " << absl::StrJoin(devices_, ",") << "); logs in " << dir_ << "\n";
    if (chaos_ != nullptr) {
      err_ << "local: chaos: " << args_.chaos << " worker and " << args_.chaos_coordinator
           << " coordinator kill(s) planned (--chaos-seed " << chaos_seed_ << ")\n";
    }
  }
  if (const int code = StartCoordinator(); code >= 0) return code;
  client::CoordinatorClient* client;
  {
    absl::MutexLock lock(&mu_);
    client = client_.get();
  }
  if (const int code = StartWorkers(*client); code >= 0) return code;
  Proc* const coordinator = coordinator_;
  // The job.
  absl::StatusOr<std::string> job_id = client->Submit(yaml_);
  if (!job_id.ok()) {
    if (job_id.status().code() == absl::StatusCode::kInvalidArgument) {
      err_ << "error: " << args_.job_path << ": " << job_id.status().message() << "\n";
      return kExitInvalid;
    }
    return Fail(job_id.status(), coordinator);
  }
  {
    absl::MutexLock lock(&mu_);
    job_id_ = *job_id;
  }
  if (abort_) CancelJobOnce("stagewise local was interrupted");  // raced with the submit
  if (!args_.quiet) err_ << "submitted job " << *job_id << "\n";

  WatchOptions watch_options;
  watch_options.quiet = args_.quiet;
  watch_options.after_event = [this](const v1::JobEvent& e) { return AfterEvent(e); };
  absl::StatusOr<v1::JobStatus> result = WatchWithProgress(*client, *job_id, watch_options, err_);
  if (chaos_ != nullptr && !args_.quiet) {
    err_ << "local: chaos: " << chaos_->Summary() << " made (--chaos-seed " << chaos_seed_ << ")";
    if (chaos_->made() < chaos_->planned()) err_ << "; the job ended before the rest";
    err_ << "\n";
  }
  const Proc* dead = nullptr;
  {
    absl::MutexLock lock(&mu_);
    dead = dead_;
  }
  // A job that failed because a child crashed: the crash is the news.
  if (dead == nullptr && result.ok() && result->state() != v1::SUCCEEDED) {
    dead = FindDeadChild(absl::Milliseconds(200));
  }
  if (signals_->first_signal() != 0 || dead != nullptr || !result.ok()) {
    const int code =
        Fail(result.ok() ? absl::AbortedError("job stopped") : result.status(), coordinator);
    // The job's last state (CANCELLED by us, usually) for scripts reading stdout.
    if (result.ok()) out_ << (args_.output == "json" ? JobJson(*result) + "\n" : JobTable(*result));
    return code;
  }
  int code = ReportResult(*result, args_.output, out_, err_);
  code = WriteOutputs(*client, *job_id, *result, code);
  if (code != kExitOk && !args_.keep_logs) {
    err_ << "(rerun with --keep-logs to keep the coordinator's and workers' logs)\n";
  }
  if (!args_.web.empty() && args_.web_linger != 0) KeepServingThePages(*job_id);
  return code;
}

void LocalRun::KeepServingThePages(const std::string& job_id) {
  const bool forever = args_.web_linger < 0;
  if (!args_.quiet) {
    err_ << "local: the job has ended; its status pages stay up at "
         << (args_.insecure ? "http" : "https") << "://" << args_.web << "/jobs/" << job_id
         << (forever ? " until Ctrl-C"
                     : absl::StrCat(" for ", args_.web_linger, " s (--web-linger)"))
         << "\n";
  }
  const absl::Time end =
      forever ? absl::InfiniteFuture() : absl::Now() + absl::Seconds(args_.web_linger);
  // A signal (OnSignal) or a child's death (OnTick) sets abort_.
  while (!abort_ && absl::Now() < end) absl::SleepFor(absl::Milliseconds(50));
}

}  // namespace

void AddLocalCommand(CommandSet& set) {
  auto shared = std::make_shared<LocalArgs>();
  LocalArgs& args = *shared;
  CLI::App* local_cmd = set.Add(
      "local", "Run a job on a coordinator and workers started here as child processes on loopback",
      [shared](Invocation& run) {
        // `local` makes its own throw-away certificates unless --insecure.
        shared->insecure = run.globals().tls.insecure;
        return run.Formatted(shared->output,
                             [&](std::ostream& o) { return Local(*shared, o, run.err()); });
      });
  local_cmd->add_option("job", args.job_path, "Job spec (YAML)")
      ->required()
      ->check(CLI::ExistingFile);
  AddSetOption(local_cmd, args.sets);
  local_cmd
      ->add_option("-j,--workers", args.workers, "Worker processes (default: the job's stages)")
      ->check(CLI::PositiveNumber);
  local_cmd
      ->add_option("--threads", args.threads,
                   "LibTorch threads per worker (default: max(1, cores / workers))")
      ->check(CLI::PositiveNumber);
  local_cmd
      ->add_option("--steps", args.steps,
                   "Run this many steps instead of the spec's length (each phase this many, "
                   "for jobs with phases); handy for smoke runs")
      ->check(CLI::PositiveNumber);
  local_cmd
      ->add_option("--chaos", args.chaos,
                   "Fault injection: kill -9 a random worker this many times while the job "
                   "runs, each time after it made progress, and restart it (same flags, port "
                   "and name). Needs checkpoint.dir in the job")
      ->check(CLI::NonNegativeNumber);
  local_cmd
      ->add_option("--chaos-coordinator", args.chaos_coordinator,
                   "Likewise kill -9 and restart the coordinator (same port and database) this "
                   "many times")
      ->check(CLI::NonNegativeNumber);
  local_cmd->add_option("--chaos-seed", args.chaos_seed,
                        "Seed of the kills' moments and victims (default: a random one, printed)");
  local_cmd->add_option("--web", args.web,
                        "Serve the coordinator's status pages (jobs, workers, the job's curves "
                        "and timeline) on this loopback address, e.g. 127.0.0.1:8080: HTTPS "
                        "with the throw-away certificate (plain HTTP with --insecure). Adds "
                        "`trace: {}` to a job without a trace section; the pages stay up after "
                        "the job ends until Ctrl-C (--web-linger)");
  local_cmd->add_option("--web-linger", args.web_linger,
                        "With --web: after the job ends, keep the pages up this many seconds "
                        "(default: until Ctrl-C; 0: stop with the job). The exit code stays "
                        "the job's");
  local_cmd->add_flag("--keep-logs", args.keep_logs,
                      "Keep the processes' logs and database and print where they are");
  local_cmd->add_flag("-q,--quiet", args.quiet, "No progress, only the result");
  local_cmd->add_option("--history", args.history,
                        "At the end, write the job's metric history (loss, evaluations, "
                        "throughput per step) to this file, for `stagewise plot FILE`");
  local_cmd->add_option("--trace", args.trace,
                        "At the end, write the job's pipeline timeline as Chrome trace JSON "
                        "(for `stagewise trace FILE`, ui.perfetto.dev); adds `trace: {}` "
                        "(mini-batches 0-9) to a job without a trace section");
  local_cmd->add_option("--timeline", args.timeline,
                        "At the end, draw the job's pipeline diagram to this FILE.svg (adds "
                        "`trace: {}` like --trace)");
  AddOutputOption(local_cmd, args.output, "Result format");
  local_cmd
      ->add_option("--devices", args.devices,
                   "Each worker's device, cycled over the workers: cpu or cuda:N, comma-"
                   "separated (e.g. cuda:0,cuda:1). Default: the job's `device`: cpu, cuda:N, "
                   "or cuda = worker n on cuda:(n mod GPUs); a GPU this machine lacks is an "
                   "error (exit 2) naming the key")
      ->delimiter(',');
}

int Local(const LocalArgs& args, std::ostream& out, std::ostream& err) {
  LocalRun run(args, out, err);
  const int code = run.Run();
  return code;
}

}  // namespace stagewise::cli
