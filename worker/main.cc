// stagewise-worker: parses its flags (worker/flags.h) and serves until a
// signal; see worker/worker.h.
#include <grpc/grpc.h>
#include <torch/torch.h>

#include <csignal>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "services/common/log.h"
#include "services/common/log_flags.h"
#include "services/rpc/health.h"
#include "services/rpc/server.h"
#include "worker/flags.h"
#include "worker/worker.h"

namespace {

using stagewise::worker::Worker;
using stagewise::worker::WorkerFlags;

// After SIGTERM with a grace period: the coordinator checkpoints the job and
// stops the stage; wait for that (or a second signal) at most `grace`.
void AwaitPreemption(Worker& worker, sigset_t& signals, absl::Duration grace) {
  STAGEWISE_LOG(INFO) << "SIGTERM: the job checkpoints and moves; exiting once the stage "
                      << "stops, within " << grace;
  const absl::Time deadline = absl::Now() + grace;
  const timespec tick{0, 100 * 1000 * 1000};
  while (worker.HasRunningStage() && absl::Now() < deadline) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) {
      STAGEWISE_LOG(INFO) << "a second signal: not waiting for the checkpoint";
      break;
    }
  }
}

int Serve(const WorkerFlags& flags) {
  if (flags.threads > 0) torch::set_num_threads(flags.threads);
  if (flags.insecure) {
    STAGEWISE_LOG(WARNING) << "--insecure: stage streams and the coordinator link are plaintext";
  }
  // Signals are taken synchronously by this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Worker worker(flags.worker);
  if (absl::Status s = worker.Start(); !s.ok()) {
    STAGEWISE_LOG(ERROR) << s.message();
    return 1;
  }
  STAGEWISE_LOG(INFO) << "serving on " << worker.address() << ", metrics on port "
                      << worker.metrics_port() << ", coordinator " << flags.worker.coordinator;
  std::unique_ptr<stagewise::rpc::HealthServer> health;
  if (!flags.health_listen.empty()) {
    auto started = stagewise::rpc::HealthServer::Start(flags.health_listen);
    if (!started.ok()) {
      STAGEWISE_LOG(ERROR) << started.status().message();
      return 1;
    }
    health = std::move(*started);
    STAGEWISE_LOG(INFO) << "health check (plaintext) on port " << health->port();
  }
  if (!flags.port_file.empty()) {
    if (absl::Status s =
            stagewise::rpc::WritePortFile(flags.port_file, worker.port(), worker.metrics_port());
        !s.ok()) {
      STAGEWISE_LOG(ERROR) << s.message();
      return 1;
    }
  }
  int signal = 0;
  sigwait(&signals, &signal);
  if (signal == SIGTERM && flags.termination_grace > absl::ZeroDuration() &&
      worker.BeginPreemption(flags.termination_grace)) {
    AwaitPreemption(worker, signals, flags.termination_grace);
  }
  STAGEWISE_LOG(INFO) << "signal " << signal << ", shutting down";
  // Probes see NOT_SERVING while the stage stops.
  if (health) health->SetServing(false);
  worker.Shutdown();
  health.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // gRPC stays initialised until the process exits. Its final grpc_shutdown
  // (when the last channel credentials go, after main) joins gRPC's executor
  // threads, and with replicated stages one of them could sit in a poll until
  // a call deadline 10 s away, which held the exit that long after an orderly
  // shutdown. Nothing is left to flush by then.
  grpc_init();
  stagewise::worker::ParsedWorkerFlags parsed = stagewise::worker::ParseWorkerFlags(
      std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
  if (!parsed.run) return parsed.exit_code;
  if (absl::Status s = stagewise::log::ApplyLogLevelFlag(parsed.flags.log_level); !s.ok()) {
    std::cerr << "stagewise-worker: " << s.message() << "\n";
    return 2;
  }
  return Serve(parsed.flags);
}
