// What a worker gives each stage it runs (its flags, its servers' options,
// the coordinator's channel): StageRuntime::Create and BuildStageParts take it.
#ifndef STAGEWISE_WORKER_RUNTIME_ENV_H_
#define STAGEWISE_WORKER_RUNTIME_ENV_H_

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "services/common/path_policy.h"
#include "services/metrics/metrics.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.pb.h"
#include "worker/collective.h"
#include "worker/device_turns.h"
#include "worker/trace.h"

namespace stagewise::worker {

struct RuntimeEnv {
  torch::Device device{torch::kCPU};
  prometheus::Registry* registry = nullptr;   // required
  std::function<void(v1::WorkerEvent)> emit;  // to the coordinator
  rpc::RpcOptions rpc;
  size_t inbox_capacity = 64;  // messages per direction
  size_t outbox_capacity = 16;
  // Same-host payloads (docs/performance.md, "Neighbours on one host"): the
  // tmpfs directory of this stage's shared-memory rings, empty for off
  // (--shared-memory-dir), and each ring's size (--shared-memory-mib).
  std::string shared_memory_dir;
  uint64_t shared_ring_bytes = uint64_t{128} << 20;
  // A CPU stage makes its outputs in the rings (worker/output_placement.h).
  bool place_outputs = true;
  // Where data.path and checkpoint.dir may point (--data-root,
  // --checkpoint-root); a job naming a path elsewhere fails to configure.
  PathRoots data_roots;
  PathRoots checkpoint_roots;
  PathRoots model_roots;  // a torchscript job's file (--model-root)
  // This host's clock offset to the coordinator's (the worker's control
  // stream estimates it); traces carry it. Null: offset 0.
  std::shared_ptr<const ClockSync> clock;
  // The job label of this stage's /metrics series (--metrics-job-ids).
  metrics::JobLabels job_labels;
  // Replicated stages (StageAssignment.num_replicas > 1, docs/replicas.md):
  // the store this stage's replicas meet through (the worker's is
  // Coordinator.CollectiveStore; tests may pass a c10d HashStore). Required
  // then; a stage with one replica never calls it.
  std::function<c10::intrusive_ptr<c10d::Store>(const v1::StageAssignment&)> collective_store;
  // Any rendezvous or gradient all-reduce slower than this fails the stage.
  absl::Duration collective_timeout = absl::Seconds(300);
  // Interleaved 1F1B: the turns the worker's stages of this job take on its
  // device (shared by them; null with one chunk per worker). A stage that
  // stops or fails cancels them.
  std::shared_ptr<DeviceTurns> turns;
  // Emulated blocks run this many times as fast on the stage's compute
  // thread (--emulated-speed; models::ScopedEmulatedSpeed).
  double emulated_speed = 1.0;
  // When set, the speed as it is at each wait instead (the worker's, which
  // --emulated-speed-file changes); it outlives the stage.
  const std::atomic<double>* emulated_speed_source = nullptr;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_RUNTIME_ENV_H_
