// stagewise-worker: flags and wiring only; see worker/worker.h.
#include <grpc/grpc.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "services/common/log.h"
#include "services/common/log_flags.h"
#include "services/common/version.h"
#include "services/metrics/flags.h"
#include "services/rpc/health.h"
#include "services/rpc/server.h"
#include "services/rpc/tls.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  // gRPC stays initialised until the process exits. Its final grpc_shutdown
  // (when the last channel credentials go, after main) joins gRPC's executor
  // threads, and with replicated stages one of them could sit in a poll until
  // a call deadline 10 s away, which held the exit that long after an orderly
  // shutdown. Nothing is left to flush by then.
  grpc_init();
  stagewise::worker::WorkerOptions options;
  if (const char* env = std::getenv("STAGEWISE_COORDINATOR")) options.coordinator = env;
  std::string port_file;
  std::string log_level = "info";
  int threads = 0;
  stagewise::rpc::TlsConfig tls;
  CLI::App app{
      "stagewise-worker: hosts one stage of a stagewise job at a time.\n"
      "Registers with the coordinator and stays up between jobs."};
  app.set_version_flag("--version", std::string("stagewise-worker ") + stagewise::Version() +
                                        " (LibTorch " + TORCH_VERSION + ")");
  app.add_option("--coordinator", options.coordinator,
                 "Coordinator address (env STAGEWISE_COORDINATOR)")
      ->capture_default_str();
  app.add_option("--listen", options.listen, "StageService address (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--advertise", options.advertise,
                 "Host other workers dial to reach this one (default: the host name)");
  app.add_option("--metrics-listen", options.metrics_listen,
                 "Prometheus /metrics address (empty: off)")
      ->capture_default_str();
  app.add_option("--device", options.device, "cpu or cuda:N")->capture_default_str();
  app.add_option("--name", options.name, "Worker id (default: advertised host:port)");
  app.add_option("--memory-bytes", options.memory_bytes,
                 "Memory a stage may use, in bytes (0: unknown); the planner's cap for jobs "
                 "without stages.memory_budget");
  app.add_option("--emulated-speed", options.emulated_speed,
                 "How fast this worker's emulated device is: `emulated` model blocks wait their "
                 "configured times divided by this (0.5: half as fast), in its stages and "
                 "profiles; for heterogeneous clusters on one machine (docs/planner.md)")
      ->check(CLI::PositiveNumber);
  app.add_option("--emulated-speed-file", options.emulated_speed_file,
                 "A file holding the emulated device's speed, read every 250 ms: writing 0.5 to it "
                 "makes the worker half as fast from then on, running stages included (a host "
                 "that slows down; rebalancing, docs/fault_tolerance.md)");
  app.add_option("--shared-memory-dir", options.shared_memory_dir,
                 "tmpfs directory for same-host payloads: a neighbouring stage on this host "
                 "(same memory, checked with a token) gets large tensors through a shared ring "
                 "here instead of the socket; the stream still carries every message and check. "
                 "Empty: off (docs/performance.md, \"Neighbours on one host\")")
      ->capture_default_str();
  app.add_option("--shared-memory-mib", options.shared_memory_mib,
                 "Size of each shared ring (one per neighbour and direction), reserved up front; "
                 "a payload that does not fit goes inline")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  double termination_grace_s = 50;
  app.add_option("--termination-grace", termination_grace_s,
                 "Seconds a SIGTERM (Kubernetes eviction, a spot notice) leaves a worker that "
                 "runs a stage: the coordinator checkpoints the job at its next step boundary and "
                 "resumes it elsewhere, and the worker exits once its stage is stopped, at the "
                 "latest after this long (keep it below the pod's "
                 "terminationGracePeriodSeconds). 0: exit at once; a second signal: at once")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  std::vector<std::string> labels;
  app.add_option("--label", labels,
                 "KEY=VALUE this worker carries, e.g. gpu=a100; repeatable. A job's "
                 "placement.labels takes only workers with all of its labels; `stagewise "
                 "workers` shows them (state, job, stage and replica are the coordinator's)")
      ->check([](const std::string& v) -> std::string {
        const size_t eq = v.find('=');
        if (eq == 0 || eq == std::string::npos) return "must be KEY=VALUE with a non-empty KEY";
        const std::string key = v.substr(0, eq);
        if (key == "state" || key == "job" || key == "stage" || key == "replica") {
          return "KEY '" + key + "' is the coordinator's (state, job, stage, replica)";
        }
        if (key.size() > 64 || v.size() - eq - 1 > 256) return "KEY at most 64, VALUE 256 bytes";
        return "";
      });
  app.add_option("--profile-cache", options.profile_cache,
                 "Where block profiles are cached (default: $STAGEWISE_PROFILE_CACHE, else "
                 "~/.cache/stagewise/profiles)");
  options.data_roots = {true, {}, "--data-root"};
  options.checkpoint_roots = {true, {}, "--checkpoint-root"};
  options.model_roots = {true, {}, "--model-root"};
  app.add_option("--data-root", options.data_roots.roots,
                 "A directory a job's data.path may name (or lie under); repeatable. Without "
                 "one, only jobs that leave data.path empty (the dataset's default) run here "
                 "(env STAGEWISE_DATA_ROOT, ':'-separated)")
      ->envname("STAGEWISE_DATA_ROOT")
      ->delimiter(':');
  app.add_option("--checkpoint-root", options.checkpoint_roots.roots,
                 "A directory a job's checkpoint.dir may name (or lie under); repeatable. "
                 "Without one, jobs with checkpoint.dir are refused here "
                 "(env STAGEWISE_CHECKPOINT_ROOT, ':'-separated)")
      ->envname("STAGEWISE_CHECKPOINT_ROOT")
      ->delimiter(':');
  app.add_option("--model-root", options.model_roots.roots,
                 "A TorchScript file, or a directory of them, that a job's model (model.name "
                 "torchscript) may load; repeatable. Without one, torchscript jobs are refused "
                 "here (env STAGEWISE_MODEL_ROOT, ':'-separated)")
      ->envname("STAGEWISE_MODEL_ROOT")
      ->delimiter(':');
  app.add_option("--max-streams", options.max_streams,
                 "Stage streams open at once; more are refused (RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-pending-streams", options.max_pending_streams,
                 "Stage streams that have not sent their first message yet; a new one closes "
                 "the oldest of the peer that holds the most")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  double collective_timeout_s = absl::ToDoubleSeconds(options.collective_timeout);
  app.add_option("--collective-timeout", collective_timeout_s,
                 "Seconds a rendezvous or gradient all-reduce among the replicas of a stage "
                 "(stages.replicas) may take before the stage fails (a lost or stuck replica)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  double first_message_timeout_s = absl::ToDoubleSeconds(options.first_message_timeout);
  app.add_option("--stream-first-message-timeout", first_message_timeout_s,
                 "Seconds a new stage stream may stay silent before it is closed (a stage opens "
                 "its stream with an OPEN message at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  std::string health_listen;
  app.add_option("--health-listen", health_listen,
                 "Plaintext grpc.health.v1 address for probes that speak no TLS, e.g. "
                 "0.0.0.0:8081 (empty: off; the health service is always on --listen too)");
  app.add_option("--threads", threads, "LibTorch CPU threads (0: LibTorch's default)");
  app.add_option("--port-file", port_file,
                 "Write 'GRPC_PORT METRICS_PORT' here once serving (for supervisors)");
  std::string metrics_job_ids = "plain";
  std::string metrics_job_key_file;
  stagewise::metrics::AddJobLabelFlags(&app, &metrics_job_ids, &metrics_job_key_file);
  stagewise::rpc::AddTlsFlags(&app, &tls);
  stagewise::log::AddLogLevelFlag(&app, &log_level);
  CLI11_PARSE(app, argc, argv);
  for (const std::string& label : labels) {
    const size_t eq = label.find('=');
    options.labels[label.substr(0, eq)] = label.substr(eq + 1);
  }
  if (auto labels = stagewise::metrics::MakeJobLabels(metrics_job_ids, metrics_job_key_file);
      labels.ok()) {
    options.job_labels = *std::move(labels);
  } else {
    std::cerr << "stagewise-worker: " << labels.status().message() << "\n";
    return 2;
  }
  if (absl::Status s = stagewise::log::ApplyLogLevelFlag(log_level); !s.ok()) {
    std::cerr << "stagewise-worker: " << s.message() << "\n";
    return 2;
  }
  if (threads > 0) torch::set_num_threads(threads);
  options.first_message_timeout = absl::Seconds(first_message_timeout_s);
  options.collective_timeout = absl::Seconds(collective_timeout_s);
  // The same credentials serve stage streams and dial the coordinator and the
  // next stage (mutual TLS: every peer is a cluster member).
  if (absl::Status s = stagewise::rpc::CheckListenPolicy(options.listen, tls); !s.ok()) {
    std::cerr << "stagewise-worker: --listen: " << s.message() << "\n";
    return 2;
  }
  if (absl::Status s = stagewise::rpc::ApplyTls(tls, &options.rpc); !s.ok()) {
    std::cerr << "stagewise-worker: " << s.message() << "\n";
    return 2;
  }
  options.require_worker_identity = tls.enabled();
  if (tls.insecure) {
    STAGEWISE_LOG(WARNING) << "--insecure: stage streams and the coordinator link are plaintext";
  }

  // Signals are taken synchronously by this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  stagewise::worker::Worker worker(options);
  if (absl::Status s = worker.Start(); !s.ok()) {
    STAGEWISE_LOG(ERROR) << s.message();
    return 1;
  }
  STAGEWISE_LOG(INFO) << "serving on " << worker.address() << ", metrics on port "
                      << worker.metrics_port() << ", coordinator " << options.coordinator;
  std::unique_ptr<stagewise::rpc::HealthServer> health;
  if (!health_listen.empty()) {
    auto started = stagewise::rpc::HealthServer::Start(health_listen);
    if (!started.ok()) {
      STAGEWISE_LOG(ERROR) << started.status().message();
      return 1;
    }
    health = std::move(*started);
    STAGEWISE_LOG(INFO) << "health check (plaintext) on port " << health->port();
  }
  if (!port_file.empty()) {
    if (absl::Status s =
            stagewise::rpc::WritePortFile(port_file, worker.port(), worker.metrics_port());
        !s.ok()) {
      STAGEWISE_LOG(ERROR) << s.message();
      return 1;
    }
  }
  int signal = 0;
  sigwait(&signals, &signal);
  const absl::Duration grace = absl::Seconds(termination_grace_s);
  if (signal == SIGTERM && grace > absl::ZeroDuration() && worker.BeginPreemption(grace)) {
    // Preemption: the coordinator checkpoints the job and stops the stage.
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
  STAGEWISE_LOG(INFO) << "signal " << signal << ", shutting down";
  // Probes see NOT_SERVING while the stage stops.
  if (health) health->SetServing(false);
  worker.Shutdown();
  health.reset();
  return 0;
}
