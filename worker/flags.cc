#include "worker/flags.h"

#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <ostream>

#include "services/common/log_flags.h"
#include "services/common/parse_flags.h"
#include "services/common/version.h"
#include "services/metrics/flags.h"
#include "services/rpc/server.h"
#include "services/rpc/tls.h"

namespace stagewise::worker {
namespace {

// The flags as CLI11 fills them, before they become WorkerFlags.
struct RawFlags {
  WorkerFlags parsed;
  rpc::TlsConfig tls;
  std::vector<std::string> labels;
  std::string metrics_job_ids = "plain";
  std::string metrics_job_key_file;
  double termination_grace_s = 50;
  double collective_timeout_s = 0;
  double first_message_timeout_s = 0;
};

std::string CheckLabel(const std::string& v) {
  const size_t eq = v.find('=');
  if (eq == 0 || eq == std::string::npos) return "must be KEY=VALUE with a non-empty KEY";
  const std::string key = v.substr(0, eq);
  if (key == "state" || key == "job" || key == "stage" || key == "replica") {
    return "KEY '" + key + "' is the coordinator's (state, job, stage, replica)";
  }
  if (key.size() > 64 || v.size() - eq - 1 > 256) return "KEY at most 64, VALUE 256 bytes";
  return "";
}

// Where it listens, whom it talks to, how it presents itself.
void AddServingFlags(CLI::App& app, RawFlags& raw) {
  WorkerOptions& o = raw.parsed.worker;
  app.add_option("--coordinator", o.coordinator, "Coordinator address (env STAGEWISE_COORDINATOR)")
      ->capture_default_str();
  app.add_option("--listen", o.listen, "StageService address (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--advertise", o.advertise,
                 "Host other workers dial to reach this one (default: the host name)");
  app.add_option("--metrics-listen", o.metrics_listen, "Prometheus /metrics address (empty: off)")
      ->capture_default_str();
  app.add_option("--name", o.name, "Worker id (default: advertised host:port)");
  app.add_option("--label", raw.labels,
                 "KEY=VALUE this worker carries, e.g. gpu=a100; repeatable. A job's "
                 "placement.labels takes only workers with all of its labels; `stagewise "
                 "workers` shows them (state, job, stage and replica are the coordinator's)")
      ->check(CheckLabel);
  app.add_option("--health-listen", raw.parsed.health_listen,
                 "Plaintext grpc.health.v1 address for probes that speak no TLS, e.g. "
                 "0.0.0.0:8081 (empty: off; the health service is always on --listen too)");
  app.add_option("--port-file", raw.parsed.port_file,
                 "Write 'GRPC_PORT METRICS_PORT' here once serving (for supervisors)");
  app.add_option("--termination-grace", raw.termination_grace_s,
                 "Seconds a SIGTERM (Kubernetes eviction, a spot notice) leaves a worker that "
                 "runs a stage: the coordinator checkpoints the job at its next step boundary and "
                 "resumes it elsewhere, and the worker exits once its stage is stopped, at the "
                 "latest after this long (keep it below the pod's "
                 "terminationGracePeriodSeconds). 0: exit at once; a second signal: at once")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

// The device, its memory and speed, and the same-host transport.
void AddDeviceFlags(CLI::App& app, RawFlags& raw) {
  WorkerOptions& o = raw.parsed.worker;
  app.add_option("--device", o.device, "cpu or cuda:N")->capture_default_str();
  app.add_option("--memory-bytes", o.memory_bytes,
                 "Memory a stage may use, in bytes (0: unknown); the planner's cap for jobs "
                 "without stages.memory_budget");
  app.add_option("--emulated-speed", o.emulated_speed,
                 "How fast this worker's emulated device is: `emulated` model blocks wait their "
                 "configured times divided by this (0.5: half as fast), in its stages and "
                 "profiles; for heterogeneous clusters on one machine (docs/planner.md)")
      ->check(CLI::PositiveNumber);
  app.add_option("--emulated-speed-file", o.emulated_speed_file,
                 "A file holding the emulated device's speed, read every 250 ms: writing 0.5 to it "
                 "makes the worker half as fast from then on, running stages included (a host "
                 "that slows down; rebalancing, docs/fault_tolerance.md)");
  app.add_option("--shared-memory-dir", o.shared_memory_dir,
                 "tmpfs directory for same-host payloads: a neighbouring stage on this host "
                 "(same memory, checked with a token) gets large tensors through a shared ring "
                 "here instead of the socket; the stream still carries every message and check. "
                 "Empty: off (docs/performance.md, \"Neighbours on one host\")")
      ->capture_default_str();
  app.add_option("--shared-memory-mib", o.shared_memory_mib,
                 "Size of each shared ring (one per neighbour and direction), reserved up front; "
                 "a payload that does not fit goes inline")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--place-outputs", o.place_outputs,
                 "A CPU stage makes the large tensors it sends to a neighbour on this host (its "
                 "activations, its gradients) in their shared ring as it computes them, so that "
                 "they go with no copy; false: they are copied into the ring when sent "
                 "(docs/performance.md, \"Outputs made in the ring\")")
      ->capture_default_str();
  app.add_option("--host-cache-mib", o.host_cache_mib,
                 "Freed CPU tensors of 1 MiB or more are kept and reused for the next tensor of "
                 "their size, up to this many MiB held free, instead of going back to the system "
                 "(whose fresh pages fault in zeroed on first write); 0: off "
                 "(docs/performance.md, \"Host memory reuse\")")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--device-copies", o.device_copies,
                 "A worker on a GPU: 'stream' page-locks the shared rings and copies messages "
                 "between the GPU and the host on a copy stream of their own, so the compute "
                 "stream never waits for them; 'sync' copies on the compute stream through "
                 "pageable memory (docs/cuda.md, \"The device side of a message\")")
      ->envname("STAGEWISE_DEVICE_COPIES")
      ->capture_default_str()
      ->check(CLI::IsMember({"stream", "sync"}));
  app.add_option("--emulate-link-delay-ms", o.rpc.emulated_link_delay_ms,
                 "Emulated one-way latency of this worker's incoming links (benchmarks, tests): "
                 "every data message from a neighbouring stage reaches its stage this many ms "
                 "after it arrived, in order; messages in flight overlap, so bandwidth is "
                 "unchanged. Set it on every worker for a round trip of twice this "
                 "(docs/performance.md, \"Links with latency\"); 0: off")
      ->envname("STAGEWISE_EMULATE_LINK_DELAY_MS")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--profile-cache", o.profile_cache,
                 "Where block profiles are cached (default: $STAGEWISE_PROFILE_CACHE, else "
                 "~/.cache/stagewise/profiles)");
  app.add_option("--threads", raw.parsed.threads, "LibTorch CPU threads (0: LibTorch's default)");
}

// What jobs may name here, and the limits that protect the worker.
void AddPolicyFlags(CLI::App& app, RawFlags& raw) {
  WorkerOptions& o = raw.parsed.worker;
  app.add_option("--data-root", o.data_roots.roots,
                 "A directory a job's data.path may name (or lie under); repeatable. Without "
                 "one, only jobs that leave data.path empty (the dataset's default) run here "
                 "(env STAGEWISE_DATA_ROOT, ':'-separated)")
      ->envname("STAGEWISE_DATA_ROOT")
      ->delimiter(':');
  app.add_option("--checkpoint-root", o.checkpoint_roots.roots,
                 "A directory a job's checkpoint.dir may name (or lie under); repeatable. "
                 "Without one, jobs with checkpoint.dir are refused here "
                 "(env STAGEWISE_CHECKPOINT_ROOT, ':'-separated)")
      ->envname("STAGEWISE_CHECKPOINT_ROOT")
      ->delimiter(':');
  app.add_option("--model-root", o.model_roots.roots,
                 "A TorchScript file, or a directory of them, that a job's model (model.name "
                 "torchscript) may load; repeatable. Without one, torchscript jobs are refused "
                 "here (env STAGEWISE_MODEL_ROOT, ':'-separated)")
      ->envname("STAGEWISE_MODEL_ROOT")
      ->delimiter(':');
  app.add_option("--max-streams", o.max_streams,
                 "Stage streams open at once; more are refused (RESOURCE_EXHAUSTED)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-pending-streams", o.max_pending_streams,
                 "Stage streams that have not sent their first message yet; a new one closes "
                 "the oldest of the peer that holds the most")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--collective-timeout", raw.collective_timeout_s,
                 "Seconds a rendezvous or gradient all-reduce among the replicas of a stage "
                 "(stages.replicas) may take before the stage fails (a lost or stuck replica)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--stream-first-message-timeout", raw.first_message_timeout_s,
                 "Seconds a new stage stream may stay silent before it is closed (a stage opens "
                 "its stream with an OPEN message at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
}

// The parsed values into WorkerFlags: 0 on success, else the exit code.
int Finish(RawFlags& raw, std::ostream& err) {
  WorkerFlags& f = raw.parsed;
  for (const std::string& label : raw.labels) {
    const size_t eq = label.find('=');
    f.worker.labels[label.substr(0, eq)] = label.substr(eq + 1);
  }
  auto labels = metrics::MakeJobLabels(raw.metrics_job_ids, raw.metrics_job_key_file);
  if (!labels.ok()) {
    err << "stagewise-worker: " << labels.status().message() << "\n";
    return 2;
  }
  f.worker.job_labels = *std::move(labels);
  f.worker.first_message_timeout = absl::Seconds(raw.first_message_timeout_s);
  f.worker.collective_timeout = absl::Seconds(raw.collective_timeout_s);
  f.termination_grace = absl::Seconds(raw.termination_grace_s);
  // The same credentials serve stage streams and dial the coordinator and the
  // next stage (mutual TLS: every peer is a cluster member).
  if (absl::Status s = rpc::CheckListenPolicy(f.worker.listen, raw.tls); !s.ok()) {
    err << "stagewise-worker: --listen: " << s.message() << "\n";
    return 2;
  }
  if (absl::Status s = rpc::ApplyTls(raw.tls, &f.worker.rpc); !s.ok()) {
    err << "stagewise-worker: " << s.message() << "\n";
    return 2;
  }
  f.worker.require_worker_identity = raw.tls.enabled();
  f.insecure = raw.tls.insecure;
  return 0;
}

}  // namespace

ParsedWorkerFlags ParseWorkerFlags(const std::vector<std::string>& args, std::ostream& out,
                                   std::ostream& err) {
  RawFlags raw;
  WorkerOptions& o = raw.parsed.worker;
  if (const char* env = std::getenv("STAGEWISE_COORDINATOR")) o.coordinator = env;
  o.data_roots = {true, {}, "--data-root"};
  o.checkpoint_roots = {true, {}, "--checkpoint-root"};
  o.model_roots = {true, {}, "--model-root"};
  raw.collective_timeout_s = absl::ToDoubleSeconds(o.collective_timeout);
  raw.first_message_timeout_s = absl::ToDoubleSeconds(o.first_message_timeout);
  CLI::App app{
      "stagewise-worker: hosts one stage of a stagewise job at a time.\n"
      "Registers with the coordinator and stays up between jobs.",
      "stagewise-worker"};
  app.set_version_flag("--version", std::string("stagewise-worker ") + Version() + " (LibTorch " +
                                        TORCH_VERSION + ")");
  AddServingFlags(app, raw);
  AddDeviceFlags(app, raw);
  AddPolicyFlags(app, raw);
  metrics::AddJobLabelFlags(&app, &raw.metrics_job_ids, &raw.metrics_job_key_file);
  rpc::AddTlsFlags(&app, &raw.tls);
  log::AddLogLevelFlag(&app, &raw.parsed.log_level);
  return ParseBinaryFlags<WorkerFlags>(
      app, args, out, err, [&] { return Finish(raw, err); }, [&] { return std::move(raw.parsed); });
}

}  // namespace stagewise::worker
