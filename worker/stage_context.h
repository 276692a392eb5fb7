// What an algorithm sees of the stage it runs on: its blocks, optimizer, data
// (stage 0), and blocking message passing with its neighbours. StageRuntime
// (worker/stage_runtime.h) implements it over gRPC streams; the unit tests'
// FakeStageContext (tests/unit/fake_stage_context.h) over in-memory queues.
#ifndef STAGEWISE_WORKER_STAGE_CONTEXT_H_
#define STAGEWISE_WORKER_STAGE_CONTEXT_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/data/dataset.h"
#include "services/metrics/metrics.h"
#include "services/models/modal_pass.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"
#include "stagewise/v1/stage.pb.h"
#include "worker/device_turns.h"
#include "worker/trace.h"

namespace stagewise::worker {

class StageContext {
 public:
  virtual ~StageContext() = default;

  virtual const JobSpec& spec() const = 0;
  // The samples of each mini-batch this stage's pipeline trains on:
  // batch_size, or its share batch_size / R on replicated stages.
  virtual int64_t batch_size() const { return spec().batch_size; }
  virtual const std::string& job_id() const = 0;
  virtual int stage() const = 0;
  virtual int num_stages() const = 0;
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == num_stages() - 1; }

  virtual models::Model& model() = 0;
  virtual torch::optim::Optimizer& optimizer() = 0;
  virtual torch::Device device() const = 0;
  // Per block of the stage: store or rebuild (reversible blocks, as the
  // planner chose); empty when the job leaves it to the algorithm.
  virtual const std::vector<models::BlockMode>& block_modes() const = 0;

  // Training length and schedule of the current phase (same numbers on every
  // stage); steps count from 0 in each phase.
  virtual int64_t steps_per_epoch() const = 0;
  virtual int64_t total_steps() const = 0;
  virtual double LearningRate(int64_t step) const = 0;
  // Whether an evaluation pass follows optimizer step `step` (1-based count of
  // steps done), per the spec's eval policy.
  virtual bool EvalDue(int64_t steps_done) const = 0;

  // Stage 0 only: training mini-batch `step` of the current phase (phases
  // continue through the data where the previous one stopped).
  virtual data::Batch TrainBatch(int64_t step) const = 0;
  // Stage 0 only: the batches.
  virtual const data::BatchSampler& train_batches() const = 0;
  virtual const data::BatchSampler& test_batches() const = 0;

  // Blocking receive from stage j-1 (FORWARD, EVAL, AUX) or from stage j+1
  // (BACKWARD). CANCELLED when the job is stopped, or the error that broke it.
  virtual absl::StatusOr<v1::StageMessage> ReceiveFromPrev() = 0;
  virtual absl::StatusOr<v1::StageMessage> ReceiveFromNext() = 0;
  // Blocking (bounded outbox) send; job_id is filled in.
  virtual absl::Status SendToNext(v1::StageMessage message) = 0;
  virtual absl::Status SendToPrev(v1::StageMessage message) = 0;

  // Checkpoints and resume (docs/fault_tolerance.md).
  // The step of the current phase this run starts from: 0, or the step of the
  // checkpoint the job resumed from when it lies inside this phase.
  virtual int64_t first_step() const = 0;
  // Whether a checkpoint is taken after `steps_done` steps of the phase: only
  // inside the phase (0 < steps_done < total_steps()); the runtime itself
  // takes those at phase starts and at the end of the job.
  virtual bool CheckpointDue(int64_t steps_done) const = 0;
  // Writes this stage's shard at the consistent cut after `steps_done` steps
  // of the phase: parameters, buffers, optimizer, RNG and data position, plus
  // the running algorithm's Algorithm::SaveState. The schedules call it where
  // CheckpointDue says, once nothing of the stage is in flight that SaveState
  // does not record.
  virtual absl::Status Checkpoint(int64_t steps_done) = 0;
  // When this phase resumes inside it (first_step() > 0): the algorithm state
  // that Algorithm::SaveState wrote at that checkpoint; nullptr otherwise.
  virtual torch::serialize::InputArchive* resume_state() = 0;
  // The phase resumes at first_step() > 0 on another cut than the
  // checkpoint's (ResumePoint.sources): parameters and optimizer state were
  // regrouped, the algorithm's state was not; each algorithm restarts its
  // pipeline at first_step() as at a phase start (docs/fault_tolerance.md).
  virtual bool resharded() const { return false; }

  // OK while the job runs; the reason once it was stopped or failed. Algorithms
  // check it at least once per step (a single stage never blocks on a peer).
  virtual absl::Status Interrupted() const = 0;

  // Replicated stages (docs/replicas.md): averages the gradients of the
  // stage's optimizer (and of `extra`, e.g. an aux head's) with the other
  // replicas of this stage, just before the optimizer step. OK and nothing
  // happens when the stage has one replica.
  virtual absl::Status AverageReplicaGradients(torch::optim::Optimizer* extra) {
    (void)extra;
    return absl::OkStatus();
  }
  // The same for `optimizer`'s parameters alone (auxnet steps its auxiliary
  // network apart from the stage's optimizer). sync.every > 1 is refused with
  // auxnet, so this always averages.
  virtual absl::Status AverageReplicaGradientsOf(torch::optim::Optimizer& optimizer) {
    (void)optimizer;
    return absl::OkStatus();
  }
  // Before the last backward of a step (backprop): with replicas, sync.every
  // = 1 and sync.overlap, the stage's gradients start their all-reduce as the
  // backward produces them, and the next AverageReplicaGradients waits for
  // them (docs/replicas.md, "Overlap"). Nothing happens otherwise.
  virtual void ArmReplicaOverlap() {}
  // How many replicas this stage has (stages.replicas; 1 without).
  virtual int num_replicas() const { return 1; }
  // Just after the optimizer step (and `extra`'s): with sync.every = H > 1,
  // every H-th call averages the replicas' parameter moves and applies the
  // outer step (docs/replicas.md). OK and nothing happens otherwise.
  virtual absl::Status SyncReplicas(torch::optim::Optimizer* extra) {
    (void)extra;
    return absl::OkStatus();
  }

  // Progress for the coordinator: last stage reports the loss of each step.
  virtual void ReportStep(int64_t steps_done, double train_loss, int64_t samples) = 0;
  virtual void ReportEval(int64_t steps_done, double loss, double accuracy, int64_t samples) = 0;

  virtual metrics::StageMetrics& stage_metrics() = 0;
  // The job's pipeline timeline (its `trace:` section), or nullptr when the
  // job does not trace. Only the compute thread records.
  virtual Tracer* tracer() { return nullptr; }
  // Interleaved 1F1B (stages.chunks_per_worker > 1): the turns this worker's
  // chunks take on its device (worker/device_turns.h); nullptr where each
  // stage has a device of its own (then the chunks' orders run unordered
  // among themselves, which only the data dependencies constrain).
  virtual DeviceTurns* device_turns() { return nullptr; }
  // A value for the job summary (sent with the stage's result), e.g.
  // "peak_inputs", "staleness_steps". Later calls overwrite.
  virtual void Summarize(const std::string& key, double value) = 0;
};

// One training algorithm, run on the stage's compute thread from the first
// step to the last. One implementation per file in worker/algorithms/.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual absl::Status Run(StageContext& ctx) = 0;
  // What the algorithm carries across a checkpoint boundary besides the
  // stage's model and optimizer (aux heads and their optimizers, stored
  // inputs, a gradient already received, partial accumulations), written
  // into `archive` at StageContext::Checkpoint. Run reads it back through
  // ctx.resume_state() after its own set-up. Default: nothing.
  virtual absl::Status SaveState(StageContext& ctx, torch::serialize::OutputArchive& archive) {
    (void)ctx;
    (void)archive;
    return absl::OkStatus();
  }
};

// The algorithm of the spec's options (worker/algorithms/registry.cc). Every
// algorithm of the spec has one: the factory is a std::visit over
// AlgorithmOptions, so a missing one does not compile.
std::unique_ptr<Algorithm> MakeAlgorithm(const AlgorithmSpec& spec);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_CONTEXT_H_
