// stagewise-coordinator: flags and wiring only; see coordinator/job_manager.h.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <string>

#include "coordinator/coordinator_service.h"
#include "coordinator/job_manager.h"
#include "coordinator/store.h"
#include "services/common/log.h"
#include "services/metrics/metrics.h"
#include "services/rpc/server.h"

int main(int argc, char** argv) {
  std::string listen = "0.0.0.0:7070";
  std::string metrics_listen = "0.0.0.0:9090";
  std::string db = "stagewise.db";
  std::string port_file;
  std::string log_level = "info";
  double heartbeat_timeout_s = 10;
  CLI::App app{
      "stagewise-coordinator: accepts jobs, assigns stages to workers, tracks progress.\n"
      "State lives in an SQLite file and survives restarts."};
  app.add_option("--listen", listen, "gRPC address (port 0: any free port)")->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address (empty: off)")
      ->capture_default_str();
  app.add_option("--db", db, "SQLite database file")->capture_default_str();
  app.add_option("--port-file", port_file,
                 "Write 'GRPC_PORT METRICS_PORT' here once serving (for supervisors)");
  app.add_option("--heartbeat-timeout", heartbeat_timeout_s,
                 "Seconds without a heartbeat before a worker is declared lost")
      ->capture_default_str();
  app.add_option("--log-level", log_level,
                 "debug | info | warning | error | off (env STAGEWISE_LOG_LEVEL sets the default)");
  if (const char* env = std::getenv("STAGEWISE_LOG_LEVEL")) log_level = env;
  CLI11_PARSE(app, argc, argv);
  if (auto level = stagewise::log::ParseLevel(log_level); level.ok()) {
    stagewise::log::SetLogLevel(*level);
  } else {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --log-level: " << level.status().message();
    return 2;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

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
  stagewise::metrics::CoordinatorMetrics coordinator_metrics((*metrics)->registry());
  stagewise::coordinator::JobManagerOptions options;
  options.heartbeat_timeout = absl::Seconds(heartbeat_timeout_s);
  stagewise::coordinator::JobManager manager(store->get(), &coordinator_metrics, options);
  if (absl::Status s = manager.Start(); !s.ok()) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: " << s.message();
    return 1;
  }
  stagewise::coordinator::CoordinatorService service(&manager);
  grpc::ServerBuilder builder;
  stagewise::rpc::ConfigureServerBuilder({}, &builder);
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --listen: cannot serve on " << listen;
    return 1;
  }
  STAGEWISE_LOG(INFO) << "stagewise-coordinator: serving on port " << port << ", metrics on port "
                      << (*metrics)->port() << ", state in " << db;
  if (!port_file.empty()) {
    if (absl::Status s = stagewise::rpc::WritePortFile(port_file, port, (*metrics)->port());
        !s.ok()) {
      STAGEWISE_LOG(ERROR) << "stagewise-coordinator: --port-file: " << s.message();
      return 1;
    }
  }
  int signal = 0;
  sigwait(&signals, &signal);
  STAGEWISE_LOG(INFO) << "stagewise-coordinator: signal " << signal << ", shutting down";
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  manager.Stop();
  return 0;
}
