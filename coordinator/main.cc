// stagewise-coordinator: parses its flags (coordinator/flags.h) and serves until
// a signal; see coordinator/job_manager.h.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/flags.h"
#include "coordinator/job_manager.h"
#include "coordinator/store.h"
#include "coordinator/web_server.h"
#include "services/common/log.h"
#include "services/common/log_flags.h"
#include "services/metrics/metrics.h"
#include "services/rpc/health.h"
#include "services/rpc/server.h"
#include "services/rpc/tls.h"
#include "services/rpc/tokens.h"

namespace {

// Keeps --tokens current: every `every` (0: never) and on Reload() (SIGHUP).
// Logs each change, and each new error once (a broken file keeps the tokens
// in force until it is fixed).
class TokenReloader {
 public:
  TokenReloader(stagewise::rpc::TokenFile* file, absl::Duration every) : file_(file) {
    if (file_ == nullptr || every <= absl::ZeroDuration()) return;
    thread_ = std::thread([this, every] {
      while (!stop_.WaitForNotificationWithTimeout(every)) Reload("timer");
    });
  }
  ~TokenReloader() { Stop(); }

  void Reload(const char* why) ABSL_LOCKS_EXCLUDED(mu_) {
    if (file_ == nullptr) {
      if (std::string(why) == "SIGHUP") {
        STAGEWISE_LOG(INFO) << "stagewise-coordinator: SIGHUP: no --tokens to reload";
      }
      return;
    }
    absl::StatusOr<bool> changed = file_->Reload();
    absl::MutexLock lock(&mu_);
    if (!changed.ok()) {
      const std::string error(changed.status().message());
      if (error != last_error_ || std::string(why) == "SIGHUP") {
        STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --tokens not reloaded (" << why
                             << "), the previous tokens stay in force: " << error;
      }
      last_error_ = error;
      return;
    }
    last_error_.clear();
    if (*changed) {
      STAGEWISE_LOG(INFO) << "stagewise-coordinator: --tokens reloaded (" << why
                          << "): " << file_->table()->size() << " tokens from " << file_->path();
    } else if (std::string(why) == "SIGHUP") {
      STAGEWISE_LOG(INFO) << "stagewise-coordinator: SIGHUP: --tokens unchanged";
    }
  }

  void Stop() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }

 private:
  stagewise::rpc::TokenFile* const file_;
  absl::Notification stop_;
  std::thread thread_;
  absl::Mutex mu_;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

using stagewise::coordinator::CoordinatorFlags;

// The servers that make up a running coordinator, in the order they start.
struct Servers {
  std::unique_ptr<stagewise::rpc::TokenFile> tokens;
  std::unique_ptr<stagewise::coordinator::JobStore> store;
  std::unique_ptr<stagewise::metrics::MetricsServer> metrics;
  std::unique_ptr<stagewise::metrics::CoordinatorMetrics> coordinator_metrics;
  std::unique_ptr<stagewise::coordinator::JobManager> manager;
  std::unique_ptr<stagewise::coordinator::CoordinatorService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::unique_ptr<stagewise::rpc::HealthServer> health;
  std::unique_ptr<stagewise::coordinator::WebServer> web;
};

// The tokens, the database, /metrics and the job manager: 0, or the exit code.
int StartState(const CoordinatorFlags& flags, Servers& s) {
  if (!flags.tokens_file.empty()) {
    auto loaded = stagewise::rpc::TokenFile::Open(flags.tokens_file);
    if (!loaded.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --tokens: " << loaded.status().message();
      return 2;
    }
    s.tokens = std::move(*loaded);
  } else {
    STAGEWISE_LOG(WARNING) << "stagewise-coordinator: no --tokens: every client that reaches "
                           << flags.listen << " is an admin";
  }
  auto store = stagewise::coordinator::JobStore::Open(flags.db);
  if (!store.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --db: " << store.status().message();
    return 1;
  }
  s.store = std::move(*store);
  auto metrics = stagewise::metrics::MetricsServer::Start(flags.metrics_listen);
  if (!metrics.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --metrics-listen: "
                         << metrics.status().message();
    return 1;
  }
  s.metrics = std::move(*metrics);
  s.coordinator_metrics = std::make_unique<stagewise::metrics::CoordinatorMetrics>(
      s.metrics->registry(), flags.job_labels);
  s.manager = std::make_unique<stagewise::coordinator::JobManager>(
      s.store.get(), s.coordinator_metrics.get(), flags.manager);
  if (absl::Status status = s.manager->Start(); !status.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << status.message();
    return 1;
  }
  return 0;
}

// The gRPC service, the health server and the status pages: 0, or the exit code.
int StartServing(const CoordinatorFlags& flags, Servers& s) {
  s.service = std::make_unique<stagewise::coordinator::CoordinatorService>(
      s.manager.get(),
      stagewise::coordinator::AccessPolicy{.token_file = s.tokens.get(),
                                           .require_worker_identity = flags.tls.enabled()});
  grpc::ServerBuilder builder;
  stagewise::rpc::ConfigureServerBuilder(flags.rpc, &builder);
  builder.AddListeningPort(flags.listen, stagewise::rpc::ServerCredentials(flags.rpc), &s.port);
  builder.RegisterService(s.service.get());
  s.server = builder.BuildAndStart();
  if (!s.server || s.port == 0) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --listen: cannot serve on " << flags.listen;
    return 1;
  }
  STAGEWISE_LOG(INFO) << "stagewise-coordinator: serving on port " << s.port
                      << (flags.tls.enabled() ? " (mutual TLS)" : " (plaintext)")
                      << ", metrics on port " << s.metrics->port() << ", state in " << flags.db;
  if (!flags.health_listen.empty()) {
    auto started = stagewise::rpc::HealthServer::Start(flags.health_listen);
    if (!started.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << started.status().message();
      return 1;
    }
    s.health = std::move(*started);
    STAGEWISE_LOG(INFO) << "stagewise-coordinator: health check (plaintext) on port "
                        << s.health->port();
  }
  if (!flags.web.listen.empty()) {
    stagewise::coordinator::WebOptions web = flags.web;
    web.tokens = s.tokens.get();
    web.metrics = s.coordinator_metrics.get();
    auto started = stagewise::coordinator::WebServer::Start(s.manager.get(), web);
    if (!started.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << started.status().message();
      return 1;
    }
    s.web = std::move(*started);
    STAGEWISE_LOG(INFO) << "stagewise-coordinator: status pages on "
                        << (s.web->https() ? "https" : "http") << "://" << web.listen << " (port "
                        << s.web->port() << ")";
  }
  return 0;
}

int Serve(const CoordinatorFlags& flags) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // reload the tokens file
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (flags.tls.insecure) {
    STAGEWISE_LOG(WARNING) << "stagewise-coordinator: --insecure: serving plaintext on "
                           << flags.listen
                           << ": anyone who reaches it can submit jobs and act as a worker";
  }
  Servers s;
  if (const int code = StartState(flags, s); code != 0) return code;
  if (const int code = StartServing(flags, s); code != 0) return code;
  if (!flags.port_file.empty()) {
    if (absl::Status status =
            stagewise::rpc::WritePortFile(flags.port_file, s.port, s.metrics->port());
        !status.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --port-file: " << status.message();
      return 1;
    }
  }
  TokenReloader reloader(s.tokens.get(), flags.tokens_reload);
  int signal = 0;
  while (true) {
    sigwait(&signals, &signal);
    if (signal != SIGHUP) break;
    reloader.Reload("SIGHUP");
  }
  reloader.Stop();
  s.web.reset();
  STAGEWISE_LOG(INFO) << "stagewise-coordinator: signal " << signal << ", shutting down";
  if (s.health) s.health->SetServing(false);
  s.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  s.manager->Stop();
  s.health.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  stagewise::coordinator::ParsedCoordinatorFlags parsed =
      stagewise::coordinator::ParseCoordinatorFlags(std::vector<std::string>(argv + 1, argv + argc),
                                                    std::cout, std::cerr);
  if (!parsed.run) return parsed.exit_code;
  if (absl::Status s = stagewise::log::ApplyLogLevelFlag(parsed.flags.log_level); !s.ok()) {
    std::cerr << "stagewise-coordinator: " << s.message() << "\n";
    return 2;
  }
  return Serve(parsed.flags);
}
