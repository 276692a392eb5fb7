// The worker process: serves StageService, keeps a control stream to the
// coordinator, and hosts one stage of one job at a time between jobs.
//
// Threads (none of them polls; every wait is on a condition):
//   - the control thread registers, keeps the session's heartbeats (a timed
//     wait on the session's end) and reconnects with backoff;
//   - the control stream is a callback reactor: gRPC delivers each command
//     to Dispatch, which only hands it on (it never builds, starts, stops or
//     joins a stage, and never blocks);
//   - the stage thread (a SerialExecutor) runs Configure, Start and Stop one
//     at a time, in the order they came, and acknowledges each when done;
//   - the profile thread runs ProfileCommands, one at a time;
//   - stage runtimes' compute threads emit events through the session's
//     Outbox (bounded, one write in flight), never writing the stream.
#ifndef STAGEWISE_WORKER_WORKER_H_
#define STAGEWISE_WORKER_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "services/common/path_policy.h"
#include "services/common/serial_executor.h"
#include "services/metrics/metrics.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.grpc.pb.h"
#include "worker/stage_runtime.h"

namespace stagewise::worker {

class WorkerStageService;  // worker/stage_service.h

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:7070";
  std::string listen = "0.0.0.0:7071";
  std::string advertise;                        // host peers dial; default: this host's name
  std::string metrics_listen = "0.0.0.0:9091";  // empty: no /metrics endpoint
  metrics::JobLabels job_labels;                // the job label of stage series
  std::string device = "cpu";
  std::string name;  // default: host:port
  int64_t memory_bytes = 0;
  // Emulated blocks wait their times divided by this on this worker, in its
  // stages and its profiles (--emulated-speed: heterogeneous clusters on one
  // machine, docs/planner.md).
  double emulated_speed = 1.0;
  // When set, a file holding the speed, read every 250 ms: writing 0.5 to it
  // makes the worker's emulated device half as fast from then on, stages
  // running included (a host slowing down, for rebalancing tests).
  std::string emulated_speed_file;
  // Same-host payloads (docs/performance.md, "Neighbours on one host"): the
  // tmpfs directory of the stages' shared-memory rings (--shared-memory-dir;
  // empty: off, every payload inline on the stream) and each ring's size.
  std::string shared_memory_dir = "/dev/shm";
  int64_t shared_memory_mib = 128;
  // A CPU stage makes the tensors it sends to a neighbour on this host in
  // their ring, with no copy afterwards (--place-outputs; docs/performance.md,
  // "Outputs made in the ring").
  bool place_outputs = true;
  // Freed host tensors of 1 MiB or more kept for reuse, up to this many MiB
  // held free (--host-cache-mib; 0: off). Process-wide: the first worker of
  // a process installs the cache, the last one started sets its limit
  // (services/tensor/host_blocks.h).
  int64_t host_cache_mib = 1024;
  // A worker on a CUDA device (--device-copies; docs/cuda.md, "The device
  // side of a message"): "stream" pins the shared rings and copies messages
  // between the GPU and the host on a copy stream of their own; "sync" copies
  // on the compute stream, through pageable memory (LibTorch's tensor.to).
  // Process-wide, set by the last worker started on a GPU.
  std::string device_copies = "stream";
  // Registered with the worker (--label KEY=VALUE): placement.labels match them.
  std::map<std::string, std::string> labels;
  std::string profile_cache;  // "" = planner::DefaultProfileCacheDir()
  absl::Duration heartbeat = absl::Seconds(1);
  absl::Duration reconnect = absl::Seconds(1);      // first retry after losing the coordinator
  absl::Duration max_reconnect = absl::Seconds(8);  // backoff cap
  rpc::RpcOptions rpc;
  // Where a job's data.path and checkpoint.dir may point. The binary always
  // confines (--data-root, --checkpoint-root); embedders may not.
  PathRoots data_roots;
  PathRoots checkpoint_roots;
  // Where a torchscript job's model file may be (--model-root).
  PathRoots model_roots;
  // Exchange streams open at once (from stages j-1, or anyone who dials the
  // port); more are refused with RESOURCE_EXHAUSTED.
  int max_streams = 64;
  // Of those, streams that have not sent their first message yet: at most
  // this many (a new one closes the oldest of the busiest peer), each for at
  // most this long (worker/stream_gate.h).
  int max_pending_streams = 16;
  // Exchange only from worker certificates (rpc::IsWorkerIdentity); the
  // binary sets it when TLS is on.
  bool require_worker_identity = false;
  absl::Duration first_message_timeout = absl::Seconds(10);
  // Replicated stages: a rendezvous or gradient all-reduce among a stage's
  // replicas slower than this fails the stage (docs/replicas.md).
  absl::Duration collective_timeout = absl::Seconds(300);
  // Events waiting to be written on the control stream; producers (compute
  // threads) wait for room, heartbeats are skipped when it is full.
  size_t control_outbox = 256;
  // For tests: runs on the stage thread before each stage is built.
  std::function<void(const v1::StageAssignment&)> before_stage_build;
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();
  // Starts the servers and the control loop (which keeps dialing the
  // coordinator until it answers).
  absl::Status Start();
  // Stops the current stage, closes the control stream and the servers.
  void Shutdown();
  // SIGTERM with a grace period (docs/fault_tolerance.md, "Preemption"): when
  // a stage runs and the coordinator is connected, tells it
  // (WorkerEvent.preempting), which checkpoints the job at its next step
  // boundary and then stops this worker's stages. True when there is
  // something to wait for (HasRunningStage); the caller then waits, at most
  // `grace`, and calls Shutdown.
  bool BeginPreemption(absl::Duration grace);
  bool HasRunningStage() const;
  // The emulated device's speed now (--emulated-speed, --emulated-speed-file).
  double emulated_speed() const { return emulated_speed_.load(); }

  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  std::string address() const;
  // The current (or last) job's stage runtime of the lowest stage; tests
  // read its model.
  std::shared_ptr<StageRuntime> runtime() const;
  // All of them: one, or with stages.chunks_per_worker = v the v virtual
  // stages this worker holds, by stage.
  std::vector<std::shared_ptr<StageRuntime>> runtimes() const;
  bool registered() const;
  // Clock replies the control stream delivered so far (tests: the stream is
  // read while a stage builds).
  int64_t clock_samples() const { return clock_->samples(); }

 private:
  class ControlStream;
  void ControlLoop();
  // One registration and control stream; `*established` once the stream is up.
  absl::Status ControlSession(bool* established);
  // The control stream's reader (a gRPC thread): hands the command on.
  void Dispatch(const v1::Command& command);
  // The stage thread: configures, starts or stops the stage.
  void RunStageCommand(const v1::Command& command);
  // The stage thread: builds the assigned stage (ConfigureCommand).
  void Configure(const v1::StageAssignment& assignment, int64_t command_id);
  // What a stage built here runs with (the device turns aside).
  RuntimeEnv StageEnv();
  void Ack(int64_t command_id);
  // --emulated-speed-file: reads the file every 250 ms until shutdown.
  void FollowSpeedFile();
  // A StageError about `job`'s stage `stage` (attempt -1: the runtime's).
  void EmitError(const std::string& job, int stage, const absl::Status& s, int attempt = -1,
                 int replica = -1);
  // Queues `event` on the current session's stream (waits for room; dropped
  // when there is no session). Heartbeats go with `may_skip`.
  void Emit(v1::WorkerEvent event, bool may_skip = false);
  // StageService.CopyReplica: a surviving replica's published state
  // (StageRuntime::ServeReplicaCopy).
  absl::Status CopyReplica(const v1::CopyReplicaRequest& request,
                           v1::CopyReplicaResponse* response);
  // Binds a new Exchange stream to this worker's stage (StageRuntime::AttachUpstream).
  absl::Status Route(const v1::StageMessage& first, const std::string& peer_identity,
                     std::shared_ptr<UpstreamStream> stream, MessageSink** sink);

  WorkerOptions options_;
  torch::Device device_{torch::kCPU};
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<WorkerStageService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> coordinator_channel_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::thread control_thread_;
  std::thread speed_thread_;  // --emulated-speed-file
  std::atomic<double> emulated_speed_{1.0};
  SerialExecutor stage_tasks_{64};
  SerialExecutor profile_tasks_{4};
  void Profile(const v1::ProfileCommand& command);
  std::atomic<bool> shutdown_{false};
  absl::Notification shutdown_requested_;
  // This host's clock offset to the coordinator's, from the heartbeats'
  // round trips; stage runtimes stamp their traces with it.
  std::shared_ptr<ClockSync> clock_ = std::make_shared<ClockSync>();

  mutable absl::Mutex mu_;
  // The stages of the current (or last) job attempt this worker holds, by
  // stage, and the turns they take on the device (interleaved).
  std::vector<std::shared_ptr<StageRuntime>> runtimes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DeviceTurns> turns_ ABSL_GUARDED_BY(mu_);
  // Stops and joins every runtime of runtimes() (the stage thread, shutdown).
  void StopAll(const absl::Status& why, bool only_running);
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::string session_ ABSL_GUARDED_BY(mu_);  // the registration's (CollectiveStore calls)
  // The current session's stream (null between sessions).
  std::shared_ptr<ControlStream> control_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_WORKER_H_
