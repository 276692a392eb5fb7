// `stagewise local`: the embedded mode. Starts a coordinator and J workers as
// child processes on loopback, runs one job through them exactly as `submit`
// would, prints the result and stops every child, also on Ctrl-C and when a
// child dies.
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "clients/cli/commands.h"
#include "clients/cli/job_format.h"
#include "clients/cli/job_watch.h"
#include "clients/cli/process.h"
#include "clients/cli/signal_watcher.h"
#include "clients/client/coordinator_client.h"
#include "services/common/job_spec.h"

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
};

class LocalRun {
 public:
  LocalRun(const LocalArgs& args, std::ostream& out, std::ostream& err)
      : args_(args), out_(out), err_(err) {}
  ~LocalRun() { Shutdown(); }

  int Run();

 private:
  // Steps of Run().
  absl::Status MakeDir();
  absl::StatusOr<Proc*> Start(const std::string& label, std::vector<std::string> argv,
                              const std::string& log_name);

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
  // A child that is not running, waiting up to `grace` for one to die: a
  // broken stream often arrives a moment before the exit can be reaped.
  const Proc* FindDeadChild(absl::Duration grace);
  void Shutdown();

  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

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
                                      const std::string& log_name) {
  absl::StatusOr<std::unique_ptr<Child>> child = Child::Spawn(argv, Path(log_name));
  if (!child.ok()) return child.status();
  auto proc = std::make_unique<Proc>(Proc{label, std::move(*child)});
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
      if (!p->child->IsRunning()) {
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
        if (!p->child->IsRunning()) return dead_ = p.get();
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

int LocalRun::Run() {
  // The job: parsed here only for its stage count (the coordinator validates
  // it again and is the authority), and sent as written.
  absl::StatusOr<JobSpec> spec = LoadJobSpec(args_.job_path);
  if (!spec.ok()) {
    err_ << "error: " << args_.job_path << ": " << spec.status().message() << "\n";
    return spec.status().code() == absl::StatusCode::kInvalidArgument ||
                   spec.status().code() == absl::StatusCode::kNotFound
               ? kExitInvalid
               : kExitFailed;
  }
  std::string yaml;
  {
    std::ifstream in(args_.job_path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    yaml = text.str();
  }
  if (args_.steps > 0) {
    auto shortened = OverrideSteps(yaml, args_.steps);
    if (!shortened.ok()) {
      err_ << "error: " << args_.job_path << ": " << shortened.status().message() << "\n";
      return kExitInvalid;
    }
    yaml = *std::move(shortened);
  }
  const int stages = spec->stages.ranges.empty() ? spec->stages.count
                                                 : static_cast<int>(spec->stages.ranges.size());
  const int num_workers = args_.workers > 0 ? args_.workers : std::max(1, stages);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = args_.threads > 0 ? args_.threads : std::max(1, cores / num_workers);

  // The binaries: next to this executable (a build or install tree), then PATH.
  const std::string self_dir = SelfExecutableDir();
  std::string binaries[2];
  const char* names[2] = {kCoordinatorBinary, kWorkerBinary};
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> found = FindExecutable(names[i], self_dir);
    if (!found.ok()) {
      err_ << "error: " << names[i] << " not found next to "
           << (self_dir.empty() ? std::string("this executable") : self_dir + "/stagewise")
           << " or on PATH\n";
      return kExitFailed;
    }
    binaries[i] = *found;
  }

  if (absl::Status s = MakeDir(); !s.ok()) {
    err_ << "error: " << s.message() << "\n";
    return kExitFailed;
  }
  signals_ =
      std::make_unique<SignalWatcher>([this](int signo) { OnSignal(signo); }, [this] { OnTick(); });
  if (!args_.quiet) {
    err_ << "local: starting a coordinator and " << num_workers << " worker(s) (" << threads
         << " thread(s) each); logs in " << dir_ << "\n";
  }

  // Coordinator.
  absl::StatusOr<Proc*> coordinator =
      Start("coordinator",
            {binaries[0], "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--db",
             Path("coordinator.db"), "--port-file", Path("coordinator.port")},
            "coordinator.log");
  if (!coordinator.ok()) return Fail(coordinator.status(), nullptr);
  absl::StatusOr<Ports> coordinator_ports =
      WaitForPortFile(Path("coordinator.port"), kStartTimeout, *(*coordinator)->child, &abort_);
  if (!coordinator_ports.ok()) return Fail(coordinator_ports.status(), *coordinator);
  const std::string address = absl::StrCat("127.0.0.1:", coordinator_ports->grpc);
  client::CoordinatorClient* client;
  {
    absl::MutexLock lock(&mu_);
    client_ = std::make_unique<client::CoordinatorClient>(address);
    client = client_.get();
  }

  // Workers: start them all, then wait for each.
  std::vector<Proc*> workers;
  for (int n = 0; n < num_workers; ++n) {
    absl::StatusOr<Proc*> worker =
        Start(absl::StrCat("worker local-", n),
              {binaries[1], "--coordinator", address, "--listen", "127.0.0.1:0", "--advertise",
               "127.0.0.1", "--metrics-listen", "127.0.0.1:0", "--port-file",
               Path(absl::StrCat("worker-", n, ".port")), "--name", absl::StrCat("local-", n),
               "--threads", absl::StrCat(threads)},
              absl::StrCat("worker-", n, ".log"));
    if (!worker.ok()) return Fail(worker.status(), nullptr);
    workers.push_back(*worker);
  }
  for (int n = 0; n < num_workers; ++n) {
    absl::StatusOr<Ports> ports = WaitForPortFile(Path(absl::StrCat("worker-", n, ".port")),
                                                  kStartTimeout, *workers[n]->child, &abort_);
    if (!ports.ok()) return Fail(ports.status(), workers[n]);
  }
  absl::Status registered = client->WaitForWorkers(num_workers, kStartTimeout, [this] {
    return abort_ ? absl::CancelledError("stopped waiting for workers") : absl::OkStatus();
  });
  if (!registered.ok()) return Fail(registered, *coordinator);
  if (!args_.quiet) {
    err_ << "local: coordinator at " << address << ", " << num_workers << " worker(s) registered\n";
  }

  // The job.
  absl::StatusOr<std::string> job_id = client->Submit(yaml);
  if (!job_id.ok()) {
    if (job_id.status().code() == absl::StatusCode::kInvalidArgument) {
      err_ << "error: " << args_.job_path << ": " << job_id.status().message() << "\n";
      return kExitInvalid;
    }
    return Fail(job_id.status(), *coordinator);
  }
  {
    absl::MutexLock lock(&mu_);
    job_id_ = *job_id;
  }
  if (abort_) CancelJobOnce("stagewise local was interrupted");  // raced with the submit
  if (!args_.quiet) err_ << "submitted job " << *job_id << "\n";

  absl::StatusOr<v1::JobStatus> result = WatchWithProgress(*client, *job_id, args_.quiet, err_);
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
        Fail(result.ok() ? absl::AbortedError("job stopped") : result.status(), *coordinator);
    // The job's last state (CANCELLED by us, usually) for scripts reading stdout.
    if (result.ok()) out_ << (args_.output == "json" ? JobJson(*result) + "\n" : JobTable(*result));
    return code;
  }
  const int code = ReportResult(*result, args_.output, out_, err_);
  if (code != kExitOk && !args_.keep_logs) {
    err_ << "(rerun with --keep-logs to keep the coordinator's and workers' logs)\n";
  }
  return code;
}

}  // namespace

int Local(const LocalArgs& args, std::ostream& out, std::ostream& err) {
  LocalRun run(args, out, err);
  const int code = run.Run();
  return code;
}

}  // namespace stagewise::cli
