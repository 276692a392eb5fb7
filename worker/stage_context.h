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
#include "services/tensor/codec.h"
#include "stagewise/v1/stage.pb.h"
#include "worker/device_turns.h"
#include "worker/send_pipe.h"
#include "worker/trace.h"

namespace stagewise::worker {

// Where a stage sits in its job; fixed for the stage's life.
struct StagePlace {
  std::string job_id;
  int stage = 0;
  int num_stages = 1;
  int replica = 0;       // which pipeline of a replicated job (0..num_replicas-1)
  int num_replicas = 1;  // stages.replicas (1 without)
  // The samples of each mini-batch this stage's pipeline trains on:
  // batch_size, or its share batch_size / R on replicated stages.
  int64_t batch_size = 0;
  torch::Device device{torch::kCPU};
  // delayed's `max_in_flight: auto`: the mini-batches this stage keeps in
  // flight, as the plan chose them to cover the links' round trip
  // (StageAssignment.max_in_flight; 0: none chosen).
  int planned_in_flight = 0;
};

// The current phase as the stage trains it (the same numbers on every
// stage); steps count from 0 in each phase.
struct PhaseWindow {
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 0;  // of the phase
  int64_t offset = 0;       // steps of the phases before it (the data position)
  // The step of the phase this run starts from: 0, or the step of the
  // checkpoint the job resumed from when it lies inside this phase.
  int64_t first_step = 0;
  // The phase resumes at first_step > 0 on another cut than the checkpoint's
  // (ResumePoint.sources): parameters and optimizer state were regrouped, the
  // algorithm's state was not; each algorithm restarts its pipeline at
  // first_step as at a phase start (docs/fault_tolerance.md).
  bool resharded = false;
  double base_lr = 0;  // the phase's peak learning rate
};

class StageReplicas;  // worker/stage_replicas.h
class WireResiduals;  // worker/wire_residuals.h

// A stage's two neighbours on the pipeline: stage j-1 and stage j+1.
enum class Side { kPrev, kNext };
// The data a stage 0 samples from.
enum class Split { kTrain, kTest };

class StageContext {
 public:
  virtual ~StageContext() = default;

  virtual const JobSpec& spec() const = 0;
  virtual const StagePlace& place() const = 0;
  const std::string& job_id() const { return place().job_id; }
  int stage() const { return place().stage; }
  int num_stages() const { return place().num_stages; }
  int replica() const { return place().replica; }
  int num_replicas() const { return place().num_replicas; }
  int64_t batch_size() const { return place().batch_size; }
  torch::Device device() const { return place().device; }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == num_stages() - 1; }

  virtual models::Model& model() = 0;
  virtual torch::optim::Optimizer& optimizer() = 0;
  // Per block of the stage: store or rebuild (reversible blocks, as the
  // planner chose); empty when the job leaves it to the algorithm.
  virtual const std::vector<models::BlockMode>& block_modes() const = 0;

  // Training length and schedule of the current phase.
  virtual PhaseWindow window() const = 0;
  int64_t steps_per_epoch() const { return window().steps_per_epoch; }
  int64_t total_steps() const { return window().total_steps; }
  int64_t first_step() const { return window().first_step; }
  bool resharded() const { return window().resharded; }
  // The learning rate of step `step` of the phase, per its schedule.
  double LearningRate(int64_t step) const;
  // Whether an evaluation pass follows optimizer step `step` (1-based count of
  // steps done), per the spec's eval policy.
  bool EvalDue(int64_t steps_done) const;

  // Stage 0 only: training mini-batch `step` of the current phase (phases
  // continue through the data where the previous one stopped); a replica's
  // share of it on replicated stages.
  data::Batch TrainBatch(int64_t step) const;
  // Stage 0 only: the batches of a split.
  virtual const data::BatchSampler& batches(Split split) const = 0;
  const data::BatchSampler& train_batches() const { return batches(Split::kTrain); }
  const data::BatchSampler& test_batches() const { return batches(Split::kTest); }

  // Blocking receive from stage j-1 (FORWARD, EVAL, AUX) or from stage j+1
  // (BACKWARD). CANCELLED when the job is stopped, or the error that broke
  // it; FAILED_PRECONDITION when the stage has no such neighbour.
  virtual absl::StatusOr<v1::StageMessage> ReceiveFrom(Side side) = 0;
  absl::StatusOr<v1::StageMessage> ReceiveFromPrev() { return ReceiveFrom(Side::kPrev); }
  absl::StatusOr<v1::StageMessage> ReceiveFromNext() { return ReceiveFrom(Side::kNext); }
  // Blocking (bounded outbox) send; job_id is filled in.
  virtual absl::Status SendTo(Side side, v1::StageMessage message) = 0;
  absl::Status SendToNext(v1::StageMessage message) {
    return SendTo(Side::kNext, std::move(message));
  }
  absl::Status SendToPrev(v1::StageMessage message) {
    return SendTo(Side::kPrev, std::move(message));
  }
  // Sends `message` with `tensors` encoded into it. StageRuntime encodes them
  // off the compute thread (worker/send_pipe.h: the send of micro-batch m
  // overlaps the compute of m + 1), so the caller must not modify them in
  // place afterwards; by default they are encoded here, then SendTo.
  virtual absl::Status SendTensorsTo(Side side, v1::StageMessage message,
                                     std::vector<OutgoingTensor> tensors);
  // How a float tensor goes to stage j+1 (`to_next`) or j-1: the job's
  // transport.compression, and the shared-memory ring when that neighbour is
  // on this host and opened it (docs/performance.md, "Neighbours on one host").
  virtual EncodeOptions Wire(bool to_next) const;
  // Called before the compute span that made `tensor` ends (TimeCompute),
  // for a tensor the stage sends to `side` next: the device's part of
  // sending it happens now, within the span, and the tensor to send instead
  // comes back (StageRuntime: an fp16/bf16 send to a CPU neighbour on this
  // host rounded into their ring, worker/output_placement.h). A gradient
  // (`side` kPrev) is given up to the send: the caller does not read it
  // again, and it may be rounded in place. By default `tensor` itself.
  virtual torch::Tensor PrepareSend(Side side, const torch::Tensor& tensor) {
    (void)side;
    return tensor;
  }
  // transport.error_feedback: the residuals of the gradients sent to stage
  // j-1, per micro-batch slot (null when off).
  virtual WireResiduals* wire_residuals() { return nullptr; }

  // Checkpoints and resume (docs/fault_tolerance.md; first_step() and
  // resharded() above).
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

  // OK while the job runs; the reason once it was stopped or failed. Algorithms
  // check it at least once per step (a single stage never blocks on a peer).
  virtual absl::Status Interrupted() const = 0;
  // A lock-step algorithm begins step `phase_step` of the phase (nothing of
  // it sent or taken yet): a replicated stage that may be copied
  // (recovery.replay) notes where it is.
  virtual void BeginStep(int64_t phase_step) { (void)phase_step; }

  // Replicated stages (docs/replicas.md): the stage's replicas, or null
  // when it has one (then the calls below do nothing and return OK).
  virtual StageReplicas* replicas() { return nullptr; }
  // Averages the gradients of the stage's optimizer (and of `extra`, e.g. an
  // aux head's) with the other replicas of this stage, just before the
  // optimizer step.
  absl::Status AverageReplicaGradients(torch::optim::Optimizer* extra);
  // The same for `optimizer`'s parameters alone (auxnet steps its auxiliary
  // network apart from the stage's optimizer). sync.every > 1 is refused with
  // auxnet, so this always averages.
  absl::Status AverageReplicaGradientsOf(torch::optim::Optimizer& optimizer);
  // Before the last backward of a step (backprop): with sync.every = 1 and
  // sync.overlap, the stage's gradients start their all-reduce as the
  // backward produces them, and the next AverageReplicaGradients waits for
  // them (docs/replicas.md, "Overlap").
  void ArmReplicaOverlap();
  // Just after the optimizer step (and `extra`'s): with sync.every = H > 1,
  // every H-th call averages the replicas' parameter moves and applies the
  // outer step (docs/replicas.md).
  absl::Status SyncReplicas(torch::optim::Optimizer* extra);

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
