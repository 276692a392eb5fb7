// stagewise-coordinator: flags and wiring only; see coordinator/job_manager.h.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_manager.h"
#include "coordinator/store.h"
#include "coordinator/web_server.h"
#include "services/common/log.h"
#include "services/common/log_flags.h"
#include "services/common/version.h"
#include "services/metrics/flags.h"
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

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "0.0.0.0:7070";
  std::string metrics_listen = "0.0.0.0:9090";
  std::string metrics_job_ids = "plain";
  std::string metrics_job_key_file;
  std::string db = "stagewise.db";
  std::string port_file;
  std::string log_level = "info";
  double heartbeat_timeout_s = 10;
  double configure_timeout_s = 120;
  double recovery_settle_s = 1;
  double metrics_ttl_s = 300;
  int max_jobs_per_owner = 100;
  std::string tokens_file;
  stagewise::rpc::TlsConfig tls;
  CLI::App app{
      "stagewise-coordinator: accepts jobs, assigns stages to workers, tracks progress.\n"
      "State lives in an SQLite file and survives restarts."};
  app.set_version_flag("--version", std::string("stagewise-coordinator ") + stagewise::Version());
  app.add_option("--listen", listen, "gRPC address (port 0: any free port)")->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address (empty: off)")
      ->capture_default_str();
  stagewise::metrics::AddJobLabelFlags(&app, &metrics_job_ids, &metrics_job_key_file);
  app.add_option("--db", db, "SQLite database file")->capture_default_str();
  app.add_option("--port-file", port_file,
                 "Write 'GRPC_PORT METRICS_PORT' here once serving (for supervisors)");
  app.add_option("--heartbeat-timeout", heartbeat_timeout_s,
                 "Seconds without a heartbeat before a worker is declared lost")
      ->capture_default_str();
  app.add_option("--configure-timeout", configure_timeout_s,
                 "Seconds the stages of a placed job have to acknowledge their assignment "
                 "before the attempt is given up (and recovered)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--recovery-settle", recovery_settle_s,
                 "Seconds a recovering job waits before it is placed again, so that every "
                 "worker lost in one fault is known (and none of them is chosen)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--finished-job-metrics-ttl", metrics_ttl_s,
                 "Seconds a finished job's stagewise_job_* series stay on /metrics (so a "
                 "scraper sees the final values) before they are removed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--tokens", tokens_file,
                 "Bearer tokens of clients, one '<secret> <role> <name>' per line (roles: "
                 "read, submit, admin); without it every client is an admin "
                 "(env STAGEWISE_TOKENS_FILE)")
      ->envname("STAGEWISE_TOKENS_FILE");
  double tokens_reload_s = 10;
  app.add_option("--tokens-reload-seconds", tokens_reload_s,
                 "How often the --tokens file is read again (rotated tokens apply to the next "
                 "calls; a file that does not parse keeps the tokens in force). 0: only on "
                 "SIGHUP, which always reloads at once")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-jobs-per-owner", max_jobs_per_owner,
                 "Jobs one token may have that have not ended")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  stagewise::coordinator::WebOptions web;
  app.add_option("--web-listen", web.listen,
                 "Address of the status pages (jobs, workers, a page per job), e.g. "
                 "127.0.0.1:8080: HTTPS with --tls-cert when TLS is on, a read token with "
                 "--tokens (empty: off; env STAGEWISE_WEB_LISTEN)")
      ->envname("STAGEWISE_WEB_LISTEN");
  app.add_option("--web-refresh-seconds", web.refresh_seconds,
                 "How often the status pages reload themselves (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  double web_header_timeout_s = absl::ToDoubleSeconds(web.limits.header_timeout);
  app.add_option("--web-header-timeout-seconds", web_header_timeout_s,
                 "Time a status-page request has for its TLS handshake, request line and "
                 "headers before its connection is closed (slow clients)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::string health_listen;
  app.add_option("--health-listen", health_listen,
                 "Plaintext grpc.health.v1 address for probes that speak no TLS, e.g. "
                 "0.0.0.0:8081 (empty: off; the health service is always on --listen too)");
  std::vector<std::string> checkpoint_roots;
  app.add_option("--checkpoint-root", checkpoint_roots,
                 "A directory a job's checkpoint.dir may name (or lie under); repeatable. "
                 "Without one, jobs with checkpoint.dir are refused "
                 "(env STAGEWISE_CHECKPOINT_ROOT, ':'-separated)")
      ->envname("STAGEWISE_CHECKPOINT_ROOT")
      ->delimiter(':');
  stagewise::rpc::AddTlsFlags(&app, &tls);
  stagewise::log::AddLogLevelFlag(&app, &log_level);
  CLI11_PARSE(app, argc, argv);
  if (absl::Status s = stagewise::log::ApplyLogLevelFlag(log_level); !s.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << s.message();
    return 2;
  }
  auto job_labels = stagewise::metrics::MakeJobLabels(metrics_job_ids, metrics_job_key_file);
  if (!job_labels.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << job_labels.status().message();
    return 2;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // reload the tokens file
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Credentials first: a misconfigured coordinator fails before touching state.
  if (absl::Status s = stagewise::rpc::CheckListenPolicy(listen, tls); !s.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --listen: " << s.message();
    return 2;
  }
  stagewise::rpc::RpcOptions rpc_options;
  if (absl::Status s = stagewise::rpc::ApplyTls(tls, &rpc_options); !s.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << s.message();
    return 2;
  }
  if (tls.insecure) {
    STAGEWISE_LOG(WARNING) << "stagewise-coordinator: --insecure: serving plaintext on " << listen
                           << ": anyone who reaches it can submit jobs and act as a worker";
  }
  std::unique_ptr<stagewise::rpc::TokenFile> tokens;
  if (!tokens_file.empty()) {
    auto loaded = stagewise::rpc::TokenFile::Open(tokens_file);
    if (!loaded.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --tokens: " << loaded.status().message();
      return 2;
    }
    tokens = std::move(*loaded);
  } else {
    STAGEWISE_LOG(WARNING) << "stagewise-coordinator: no --tokens: every client that reaches "
                           << listen << " is an admin";
  }
  auto store = stagewise::coordinator::JobStore::Open(db);
  if (!store.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --db: " << store.status().message();
    return 1;
  }
  auto metrics = stagewise::metrics::MetricsServer::Start(metrics_listen);
  if (!metrics.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --metrics-listen: "
                         << metrics.status().message();
    return 1;
  }
  stagewise::metrics::CoordinatorMetrics coordinator_metrics((*metrics)->registry(),
                                                             *std::move(job_labels));
  stagewise::coordinator::JobManagerOptions options;
  options.heartbeat_timeout = absl::Seconds(heartbeat_timeout_s);
  options.configure_timeout = absl::Seconds(configure_timeout_s);
  options.recovery_settle = absl::Seconds(recovery_settle_s);
  options.finished_job_metrics_ttl = absl::Seconds(metrics_ttl_s);
  options.max_live_jobs_per_owner = max_jobs_per_owner;
  options.checkpoint_roots = {true, checkpoint_roots, "--checkpoint-root"};
  stagewise::coordinator::JobManager manager(store->get(), &coordinator_metrics, options);
  if (absl::Status s = manager.Start(); !s.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << s.message();
    return 1;
  }
  stagewise::coordinator::CoordinatorService service(
      &manager, {.token_file = tokens.get(), .require_worker_identity = tls.enabled()});
  grpc::ServerBuilder builder;
  stagewise::rpc::ConfigureServerBuilder(rpc_options, &builder);
  int port = 0;
  builder.AddListeningPort(listen, stagewise::rpc::ServerCredentials(rpc_options), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --listen: cannot serve on " << listen;
    return 1;
  }
  STAGEWISE_LOG(INFO) << "stagewise-coordinator: serving on port " << port
                      << (tls.enabled() ? " (mutual TLS)" : " (plaintext)") << ", metrics on port "
                      << (*metrics)->port() << ", state in " << db;
  std::unique_ptr<stagewise::rpc::HealthServer> health;
  if (!health_listen.empty()) {
    auto started = stagewise::rpc::HealthServer::Start(health_listen);
    if (!started.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << started.status().message();
      return 1;
    }
    health = std::move(*started);
    STAGEWISE_LOG(INFO) << "stagewise-coordinator: health check (plaintext) on port "
                        << health->port();
  }
  std::unique_ptr<stagewise::coordinator::WebServer> web_server;
  if (!web.listen.empty()) {
    web.tls = tls;
    web.tokens = tokens.get();
    web.metrics = &coordinator_metrics;
    web.limits.header_timeout = absl::Seconds(web_header_timeout_s);
    auto started = stagewise::coordinator::WebServer::Start(&manager, web);
    if (!started.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << started.status().message();
      return 1;
    }
    web_server = std::move(*started);
    STAGEWISE_LOG(INFO) << "stagewise-coordinator: status pages on "
                        << (web_server->https() ? "https" : "http") << "://" << web.listen
                        << " (port " << web_server->port() << ")";
  }
  if (!port_file.empty()) {
    if (absl::Status s = stagewise::rpc::WritePortFile(port_file, port, (*metrics)->port());
        !s.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --port-file: " << s.message();
      return 1;
    }
  }
  TokenReloader reloader(tokens.get(), absl::Seconds(tokens_reload_s));
  int signal = 0;
  while (true) {
    sigwait(&signals, &signal);
    if (signal != SIGHUP) break;
    reloader.Reload("SIGHUP");
  }
  reloader.Stop();
  web_server.reset();
  STAGEWISE_LOG(INFO) << "stagewise-coordinator: signal " << signal << ", shutting down";
  if (health) health->SetServing(false);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  manager.Stop();
  health.reset();
  return 0;
}
