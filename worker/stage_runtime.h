// One stage of one job on a worker: the blocks, optimizer, data (stage 0),
// bounded inboxes fed by the peer streams, and the compute thread that runs
// the job's algorithm. Knows nothing algorithm-specific.
#ifndef STAGEWISE_WORKER_STAGE_RUNTIME_H_
#define STAGEWISE_WORKER_STAGE_RUNTIME_H_

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/bounded_queue.h"
#include "services/common/path_policy.h"
#include "services/metrics/metrics.h"
#include "services/models/blocks.h"
#include "services/models/memory_meter.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.pb.h"
#include "worker/collective.h"
#include "worker/device_turns.h"
#include "worker/neighbour_link.h"
#include "worker/output_placement.h"
#include "worker/peer_stream.h"
#include "worker/replica_copy.h"
#include "worker/runtime_env.h"
#include "worker/same_host.h"
#include "worker/stage_assignment.h"
#include "worker/stage_builder.h"
#include "worker/stage_context.h"
#include "worker/stage_phases.h"
#include "worker/stage_replicas.h"
#include "worker/stage_reporter.h"
#include "worker/stage_resume.h"
#include "worker/stage_shards.h"
#include "worker/stage_streams.h"
#include "worker/wire_residuals.h"

namespace stagewise::worker {

class StageRuntime final : public StageContext {
 public:
  static absl::StatusOr<std::shared_ptr<StageRuntime>> Create(const v1::StageAssignment& assignment,
                                                              RuntimeEnv env);
  ~StageRuntime() override;

  // Dials stage j+1 (if any) and starts the compute thread.
  absl::Status Start();
  // Multi-phase jobs: the coordinator's go-ahead for `phase` (every stage
  // finished the one before; `strict`: FAILED_PRECONDITION if it is not the
  // next one), or with `strict` false for every phase up to it (a replacing
  // stage's, which the job has begun already). StagePhases::Release.
  absl::Status ReleasePhase(int phase, bool strict);
  // Aborts the job on this stage (coordinator's Stop, or shutdown).
  void Stop(const absl::Status& why);
  // Fails the job: reported to the coordinator once, then everything stops.
  void Fail(const absl::Status& why);
  // Waits for the compute thread to end. Callers may race (the worker's
  // shutdown and a stop command both join): one joins, the others wait.
  void Join();
  bool running() const;
  // Start() was called (the compute thread exists or existed).
  bool started() const;
  // The result of the compute thread once it has ended.
  std::optional<absl::Status> outcome() const;

  // StageService routing: binds the stream from j-1 when `message` is its
  // OPEN (valid, this attempt) and `peer_identity` (the stream's certificate
  // identity) is the assignment's prev_identity (when that is set). Else
  // nothing changes: INVALID_ARGUMENT for a malformed message,
  // PERMISSION_DENIED for anything else.
  absl::Status AttachUpstream(const v1::StageMessage& message, const std::string& peer_identity,
                              std::shared_ptr<UpstreamStream> stream, MessageSink** sink);
  std::shared_ptr<models::Model> model_ptr() const { return model_; }
  // CheckpointCommand, stage 0 (any thread): the job checkpoints after the
  // mini-batch this stage sends next (the compute thread picks the step,
  // PlanExtraCut, and every stage learns it from StageMessage.checkpoint_step).
  void RequestCheckpoint();
  // recovery.replay (NeighbourReplaced): stage j-1 moved (its stream from
  // the new worker is taken from now on) or stage j+1 did (dialed at once).
  absl::Status NeighbourReplaced(const v1::NeighbourReplaced& replaced);
  // recovery.replay: a checkpoint after global step `step` is committed; the
  // messages kept from before it go.
  void CheckpointCommitted(int64_t step);
  // recovery.replay with replicas: a replica of this stage was lost and the
  // group forms again (StageReplicas::Regroup).
  void ReplicaRegroup(const v1::ReplicaRegroup& regroup);
  // StageService.CopyReplica: a piece of the state this replica published.
  absl::Status ServeReplicaCopy(const v1::CopyReplicaRequest& request,
                                v1::CopyReplicaResponse* response) const {
    return replica_copy_.Serve(request, response);
  }

  // StageContext
  const JobSpec& spec() const override { return spec_; }
  const StagePlace& place() const override { return place_; }
  int attempt() const { return assignment_.attempt(); }
  models::Model& model() override { return *model_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  const std::vector<models::BlockMode>& block_modes() const override {
    return resolved_.block_modes;
  }
  PhaseWindow window() const override;
  const data::BatchSampler& batches(Split split) const override {
    return split == Split::kTrain ? *train_ : *test_;
  }
  absl::StatusOr<v1::StageMessage> ReceiveFrom(Side side) override;
  absl::Status SendTo(Side side, v1::StageMessage message) override {
    return SendTensorsTo(side, std::move(message), {});
  }
  absl::Status SendTensorsTo(Side side, v1::StageMessage message,
                             std::vector<OutgoingTensor> tensors) override;
  EncodeOptions Wire(bool to_next) const override;
  torch::Tensor PrepareSend(Side side, const torch::Tensor& tensor) override {
    // Error feedback narrows on the compute thread when it sends (its residual).
    const bool narrow_now = placement_ && !spec_.transport.error_feedback;
    return narrow_now ? placement_->Prepare(side, tensor) : tensor;
  }
  absl::Status Interrupted() const override;
  void BeginStep(int64_t phase_step) override;
  bool CheckpointDue(int64_t steps_done) const override;
  absl::Status Checkpoint(int64_t steps_done) override;
  torch::serialize::InputArchive* resume_state() override { return resume_.state(); }
  void ReportStep(int64_t steps_done, double train_loss, int64_t samples) override;
  void ReportEval(int64_t steps_done, double loss, double accuracy, int64_t samples) override;
  metrics::StageMetrics& stage_metrics() override { return *metrics_; }
  Tracer* tracer() override { return tracer_.get(); }
  DeviceTurns* device_turns() override { return env_.turns.get(); }
  void Summarize(const std::string& key, double value) override {
    reporter_->Summarize(key, value);
  }
  StageReplicas* replicas() override { return replicas_.get(); }
  WireResiduals* wire_residuals() override {
    return spec_.transport.error_feedback ? &wire_residuals_ : nullptr;
  }

 private:
  // Replicated stages: meets the stage's other replicas (compute thread,
  // before the first step).
  absl::Status JoinReplicas();
  explicit StageRuntime(RuntimeEnv env);
  absl::StatusOr<v1::StageMessage> Receive(BoundedQueue<v1::StageMessage>& queue,
                                           NeighbourLink& link, v1::SpanKind wait);
  // A replacing stage: once it is where the lost stage was (it has sent
  // again all its neighbours hold), says so (ReplayDone) and reports again.
  void NoteCaughtUp(int64_t step);
  bool replaying() const { return assignment_.replacing() && !replay_done_.load(); }
  // Sends the spans recorded since the last chunk to the coordinator (compute
  // thread; a final one before the stage's result).
  void EmitTrace();
  absl::Status ValidateIncoming(const v1::StageMessage& m, bool from_prev) const;
  void ComputeLoop();
  // A checkpoint after global step `step` besides checkpoint.every_*, picked
  // here (stage 0): noted and reported (WorkerEvent.checkpoint_planned).
  void PlanExtraCut(int64_t step);
  // Whether checkpoint.every_* or a planned cut asks for a checkpoint after
  // global step `step`.
  bool CheckpointScheduled(int64_t step) const;
  // Writes this stage's shard of the checkpoint after `phase_step` steps of
  // the current phase (atomically) and reports it to the coordinator.
  // `with_algorithm`: include Algorithm::SaveState (inside a phase only).
  absl::Status WriteShard(int64_t phase_step, bool with_algorithm);
  // Loads the shard named by StageAssignment.resume (Create, after phase 0
  // is set up): enters the checkpoint's phase, restores everything; on
  // another cut (ResumePoint.sources) regroups what the stage holds from the
  // sources (worker/reshard.h) and restarts the algorithm's state.
  absl::Status LoadResume(const v1::ResumePoint& resume);
  // A replacing replica (StageAssignment.replica_source): copies a
  // surviving replica's state and starts from the step it waits in.
  absl::Status LoadReplicaCopy();
  // StageShards::EnterPosition: enters the phases up to the shard's and
  // checks that (phase, phase_step, step) fit the job; DATA_LOSS naming
  // `where` otherwise.
  absl::Status EnterResumedPhase(const checkpoint::ShardPosition& at, const std::string& where);
  // The resumed position: the stage goes on from it (and a replacement
  // replays from its marks).
  void SetResumed(StageShards::Restored restored);
  // Records `why` (the first error stays) and closes the inboxes and streams.
  void Abort(const absl::Status& why);
  // Stamps `message` (global step `step`) with the job and attempt, sends it
  // through `link` and counts it once sent. Any thread (a send pipe's).
  absl::Status SendStamped(v1::StageMessage message, NeighbourLink& link, int64_t step);
  // Every queued send handed to its stream (before a checkpoint, at the end
  // of a phase): OK, or the first send's error.
  absl::Status DrainSends();
  // Sets up phase p (its step window, algorithm, optimizer, schedule).
  absl::Status EnterPhase(int p);
  absl::Status RunPhases();

  RuntimeEnv env_;
  v1::StageAssignment assignment_;
  StagePlace place_;
  // The job's spec as submitted (its model file confined), with the current
  // phase's algorithm, optimizer and schedule (EnterPhase).
  JobSpec spec_;
  // What the plan chose for this stage (wire formats, depth, schedule,
  // block modes), resolved once from the assignment.
  ResolvedStage resolved_;
  std::shared_ptr<models::Model> model_;
  // Its checkpoint shards: written, resumed from, copied from a replica.
  std::unique_ptr<StageShards> shards_;
  // CPU tensors of this stage (model build and compute thread), for
  // peak_memory_bytes and the memory gauges.
  std::shared_ptr<models::MemoryAccount> memory_ = std::make_shared<models::MemoryAccount>();
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<Algorithm> algorithm_;
  std::unique_ptr<StageReplicas> replicas_;  // joins when num_replicas() > 1
  WireResiduals wire_residuals_;             // transport.error_feedback
  data::Datasets data_;
  std::unique_ptr<data::BatchSampler> train_, test_;
  // The job's phases: the current one's window and the go-ahead for the next.
  std::unique_ptr<StagePhases> phases_;
  std::unique_ptr<metrics::StageMetrics> metrics_;
  std::unique_ptr<StageReporter> reporter_;         // after metrics_: destroyed before it
  std::unique_ptr<Tracer> tracer_;                  // with the spec's trace: section
  std::optional<ClockSync::Estimate> trace_clock_;  // taken at the first chunk
  // Where the run starts when not at the job's beginning (a shard or a
  // replica's copy): the phase and step, the algorithm state saved there.
  StageResume resume_;
  // Planned checkpoints (CheckpointCommand): asked for (any thread), and the
  // global steps planned (compute thread only).
  std::atomic<bool> checkpoint_requested_{false};
  std::set<int64_t> extra_cuts_;

  // The neighbours on the wire: streams, inboxes, rings, and with
  // recovery.replay what was sent since the last committed checkpoint.
  std::unique_ptr<StageStreams> streams_;
  // Sends to stage j+1 and j-1, encoded off the compute thread (after
  // streams_, which they send to: destroyed first).
  std::unique_ptr<SendPipe> to_next_pipe_, to_prev_pipe_;
  std::optional<OutputPlacement> placement_;  // the compute thread's, while it runs (CPU)
  // A replacing stage: when it started, the bytes it took while replaying,
  // and whether it caught up (where it resumed: resume_).
  std::chrono::steady_clock::time_point started_at_;
  std::atomic<int64_t> replay_bytes_{0};
  std::atomic<bool> replay_done_{false};
  // Replicated stages with recovery.replay: where each step began and what
  // this replica published for a lost one's copy; a replacing replica's copy.
  ReplicaCopy replica_copy_;

  // The stage's lifecycle:
  //   kCreated --Start--> kRunning --compute thread ends--> kFinished
  //   kCreated, kRunning --Stop--> kStopping --compute thread ends--> kFinished
  // A stopped stage reports nothing to the coordinator (it asked, or the
  // worker is going away); a failed one reports its first error once.
  enum class Lifecycle { kCreated, kRunning, kStopping, kFinished };
  // The only writer of lifecycle_: false (and nothing changes) for a move
  // the diagram above does not have.
  bool Transition(Lifecycle to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `why` when it is the stage's first error (sticky: later errors are
  // echoes of it, a peer's broken stream after this stage failed, say).
  void RecordError(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Lifecycle lifecycle_ ABSL_GUARDED_BY(mu_) = Lifecycle::kCreated;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  absl::Status outcome_ ABSL_GUARDED_BY(mu_);  // the compute thread's, once kFinished
  std::thread compute_;
  absl::Mutex join_mu_;  // serialises Join (std::thread::join is not re-entrant)
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_RUNTIME_H_
