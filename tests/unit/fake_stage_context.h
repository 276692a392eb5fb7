// An in-process stand-in for StageRuntime, for unit tests of the training
// algorithms without gRPC: a FakeJob holds the J stages of one job (model
// slice, optimizer, schedule, synthetic data on stage 0, metrics) connected by
// in-memory bounded queues, and runs each stage's algorithm on its own thread.
// Learning rate, evaluation policy and training batches follow
// worker/stage_runtime.cc for the job's first phase. A test may run only some
// stages and play the others itself through the queues (Forward/Backward).
//
// Checkpoints: with set_checkpoint_every(k) the stages checkpoint after every
// k steps (inside the phase); each Checkpoint serializes the stage's model,
// optimizer and the running algorithm's SaveState into a shard (a string).
// A fresh job built from the same spec can Resume from a complete checkpoint:
// it loads the shards and its algorithms start at that step with the saved
// algorithm state, as StageRuntime does when a job resumes.
#ifndef STAGEWISE_TESTS_UNIT_FAKE_STAGE_CONTEXT_H_
#define STAGEWISE_TESTS_UNIT_FAKE_STAGE_CONTEXT_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/bounded_queue.h"
#include "services/data/dataset.h"
#include "services/metrics/metrics.h"
#include "services/spec/job_spec.h"
#include "worker/stage_context.h"
#include "worker/wire_residuals.h"

namespace stagewise::testing {

using MessageQueue = BoundedQueue<v1::StageMessage>;

// What the last stage reported through ReportStep / ReportEval.
struct StepReport {
  int64_t steps_done = 0;
  double loss = 0;
  int64_t samples = 0;
};
struct EvalReport {
  int64_t steps_done = 0;
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
};

class FakeJob;

// One checkpoint of a FakeJob: stage j's shard at [j], as
// FakeStageContext::Checkpoint serialized it (archive entries "model",
// "optimizer", "algorithm" and "steps_done").
using FakeCheckpoint = std::vector<std::string>;

class FakeStageContext : public worker::StageContext {
 public:
  const JobSpec& spec() const override { return spec_; }
  const worker::StagePlace& place() const override { return place_; }
  models::Model& model() override { return *model_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  const std::vector<models::BlockMode>& block_modes() const override { return block_modes_; }
  worker::PhaseWindow window() const override;
  const data::BatchSampler& batches(worker::Split split) const override {
    return split == worker::Split::kTrain ? *train_ : *test_;
  }
  absl::StatusOr<v1::StageMessage> ReceiveFrom(worker::Side side) override;
  absl::Status SendTo(worker::Side side, v1::StageMessage message) override;
  absl::Status Interrupted() const override;
  void ReportStep(int64_t steps_done, double train_loss, int64_t samples) override;
  void ReportEval(int64_t steps_done, double loss, double accuracy, int64_t samples) override;
  metrics::StageMetrics& stage_metrics() override { return *metrics_; }
  // With the spec's trace: section (the compute spans the algorithms record;
  // the runtime's waits are not in a fake).
  worker::Tracer* tracer() override { return tracer_.get(); }
  // Interleaved: the turns of the fake worker holding this stage.
  worker::DeviceTurns* device_turns() override { return turns_; }
  void Summarize(const std::string& key, double value) override;
  bool CheckpointDue(int64_t steps_done) const override;
  // Writes this stage's shard of checkpoint `steps_done` into the job;
  // INTERNAL unless CheckpointDue(steps_done), or if it was taken already.
  absl::Status Checkpoint(int64_t steps_done) override;
  torch::serialize::InputArchive* resume_state() override { return resume_state_.get(); }
  // transport.error_feedback, saved and resumed as StageRuntime does.
  worker::WireResiduals* wire_residuals() override {
    return spec_.transport.error_feedback ? &wire_residuals_ : nullptr;
  }

  // What the algorithm left behind, for assertions.
  std::map<std::string, double> summary() const;
  std::vector<StepReport> steps() const;
  std::vector<EvalReport> evals() const;
  void set_block_modes(std::vector<models::BlockMode> modes) { block_modes_ = std::move(modes); }
  // StageAssignment.max_in_flight, as the runtime puts it in its place.
  void set_planned_in_flight(int depth) { place_.planned_in_flight = depth; }

 private:
  friend class FakeJob;

  // One checkpoint of a FakeJob: stage j's shard at [j], as
  // FakeStageContext::Checkpoint serialized it (archive entries "model",
  // "optimizer", "algorithm" and "steps_done").
  using FakeCheckpoint = std::vector<std::string>;
  FakeStageContext() = default;
  absl::StatusOr<v1::StageMessage> Receive(MessageQueue* queue);

  FakeJob* job_ = nullptr;
  JobSpec spec_;
  worker::StagePlace place_;
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<models::BlockMode> block_modes_;
  int64_t steps_per_epoch_ = 1;
  int64_t total_steps_ = 0;
  double base_lr_ = 0;
  const data::BatchSampler* train_ = nullptr;  // stage 0 only; owned by the job
  const data::BatchSampler* test_ = nullptr;
  MessageQueue* from_prev_ = nullptr;  // owned by the job; null at the ends
  MessageQueue* from_next_ = nullptr;
  MessageQueue* to_next_ = nullptr;
  MessageQueue* to_prev_ = nullptr;
  std::unique_ptr<metrics::StageMetrics> metrics_;
  std::unique_ptr<worker::Tracer> tracer_;
  worker::DeviceTurns* turns_ = nullptr;    // owned by the job; null without chunks
  worker::Algorithm* algorithm_ = nullptr;  // while Run runs on this stage's thread
  worker::WireResiduals wire_residuals_;
  int64_t checkpoint_every_ = 0;
  int64_t first_step_ = 0;
  // After Resume: the loaded shard (kept alive for the nested archive) and
  // the algorithm's part of it.
  std::unique_ptr<checkpoint::ShardReader> resume_shard_;
  std::unique_ptr<torch::serialize::InputArchive> resume_state_;
  mutable absl::Mutex mu_;
  std::map<std::string, double> summary_ ABSL_GUARDED_BY(mu_);
  std::vector<StepReport> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<EvalReport> evals_ ABSL_GUARDED_BY(mu_);
};

class FakeJob {
 public:
  // Builds every stage of `spec` (its first phase) on the CPU.
  static absl::StatusOr<std::unique_ptr<FakeJob>> Create(const JobSpec& spec,
                                                         size_t queue_capacity = 64);
  // Parses `yaml` first.
  static absl::StatusOr<std::unique_ptr<FakeJob>> FromYaml(const std::string& yaml,
                                                           size_t queue_capacity = 64);
  ~FakeJob();

  int num_stages() const { return static_cast<int>(stages_.size()); }
  FakeStageContext& stage(int j) { return *stages_.at(j); }

  // Runs the spec's algorithm on `stages` (all when empty), each on its own
  // thread, until every one returns; returns each one's status in order. A
  // stage that fails stops the job (the others get its status), as in the
  // runtime. Call once.
  std::vector<absl::Status> Run(std::vector<int> stages = {});

  // Stops the job: Interrupted() and blocked receives answer `why`.
  void Stop(const absl::Status& why);

  // The queues between stage j and j+1, for tests that play a stage: FORWARD
  // (and EVAL, AUX) messages stage j sent up, and BACKWARD messages for j.
  MessageQueue& forward_queue(int j) { return *forward_.at(j); }
  MessageQueue& backward_queue(int j) { return *backward_.at(j); }

  // Parameters of every stage in order, detached copies (comparable with the
  // whole model's parameters(), which list blocks in the same order).
  std::vector<torch::Tensor> Parameters() const;
  // Buffers (BatchNorm running statistics and counts) of every stage in order,
  // copies.
  std::vector<torch::Tensor> Buffers() const;

  // Checkpoints after every `every` steps s with 0 < s < total_steps (0: none,
  // the default). Call before Run.
  void set_checkpoint_every(int64_t every);
  // The checkpoints taken so far, by step; a complete one has a shard for
  // every stage.
  std::map<int64_t, FakeCheckpoint> checkpoints() const;

  // How Resume hands the saved algorithm state to the algorithms.
  enum class AlgorithmState {
    kSaved,   // as saved (what StageRuntime does)
    kZeroed,  // every floating-point tensor in it zeroed, integers kept: a
              // state that passes the algorithms' consistency checks but
              // does not restore what they carried (sanity tests)
    kNone,    // resume_state() is nullptr
  };
  // Loads `checkpoint`, taken after `step` steps of this job's spec, into
  // every stage of this fresh job (model, optimizer), so that Run starts at
  // `step` with the saved algorithm state. Call before Run.
  absl::Status Resume(const FakeCheckpoint& checkpoint, int64_t step,
                      AlgorithmState state = AlgorithmState::kSaved);

 private:
  friend class FakeStageContext;
  FakeJob() = default;
  absl::Status failure() const;
  absl::Status AddShard(int64_t steps_done, int stage, std::string shard);

  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  data::Datasets data_;
  std::unique_ptr<data::BatchSampler> train_, test_;
  std::vector<std::unique_ptr<MessageQueue>> forward_, backward_;
  std::vector<std::unique_ptr<FakeStageContext>> stages_;
  std::vector<std::unique_ptr<worker::DeviceTurns>> turns_;  // per fake worker (interleaved)
  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, FakeCheckpoint> checkpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_UNIT_FAKE_STAGE_CONTEXT_H_
