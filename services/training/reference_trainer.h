// The single-process reference trainer: plain backpropagation of a whole zoo
// model on one device. It is the oracle every distributed algorithm is checked
// against, so it stays short and obvious.
#ifndef STAGEWISE_SERVICES_TRAINING_REFERENCE_TRAINER_H_
#define STAGEWISE_SERVICES_TRAINING_REFERENCE_TRAINER_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/checkpoint/checkpoint.h"
#include "services/data/dataset.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"

namespace stagewise::training {

struct Progress {
  int64_t step = 0;  // optimizer steps done
  int64_t total_steps = 0;
  double epoch = 0;  // fractional epochs done
  double loss = 0;   // mean training loss since the previous progress call
  double lr = 0;
  double samples_per_second = 0;
  double elapsed_seconds = 0;
  double eta_seconds = 0;
};

struct EvalResult {
  int64_t step = 0;
  double loss = 0;
  double accuracy = 0;  // in [0, 1]
  int64_t samples = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double epochs = 0;
  // Mean over the steps since the last report (LossWindow: the window a
  // distributed job's train_loss has).
  double train_loss = 0;
  EvalResult test;  // final evaluation
  std::vector<EvalResult> evals;
  double seconds = 0;  // training time, evaluation excluded
  double samples_per_second = 0;
  // Text jobs: bytes predicted per second of training (0 for images).
  double tokens_per_second = 0;
  int64_t num_parameters = 0;
  std::string last_checkpoint;
};

struct TrainOptions {
  int64_t log_every_steps = 50;
  std::function<void(const Progress&)> on_progress;
  std::function<void(const EvalResult&)> on_eval;
  bool resume = true;  // continue from the newest committed checkpoint of the job
  // The job as written, kept in every checkpoint's manifest so that
  // `stagewise export` can rebuild the model from the checkpoint alone.
  std::string spec_yaml;
};

class ReferenceTrainer {
 public:
  // Loads the data and builds the whole model on spec.device.
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(const JobSpec& spec);

  // Trains for spec.epochs or spec.steps, evaluating and checkpointing as the
  // spec asks.
  absl::StatusOr<TrainResult> Run(const TrainOptions& options = {});

  // One step of plain backprop on `batch` at learning rate `lr`; returns the loss.
  double Step(const data::Batch& batch, double lr);
  // Forward-only pass over the test set in eval mode.
  EvalResult Evaluate();

  models::Model& model() { return *model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const data::BatchSampler& train_sampler() const { return *train_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t step() const { return step_; }

  // Checkpoints use the layout of a distributed job's (services/checkpoint/):
  // <checkpoint.dir>/<job name>/step-<N>/{stage-0.pt, MANIFEST}, one shard
  // holding every block. SaveCheckpoint returns the step directory.
  absl::StatusOr<std::string> SaveCheckpoint(const std::string& spec_yaml) const;
  absl::Status LoadCheckpoint(const checkpoint::Committed& committed);

 private:
  ReferenceTrainer() = default;
  absl::Status MaybeCheckpoint(bool force, const std::string& spec_yaml, std::string* written);

  JobSpec spec_;
  torch::Device device_{torch::kCPU};
  data::Datasets data_;
  std::unique_ptr<data::BatchSampler> train_;
  std::unique_ptr<data::BatchSampler> test_;
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t total_steps_ = 0;
  int64_t step_ = 0;
  double base_lr_ = 0;
};

}  // namespace stagewise::training

#endif  // STAGEWISE_SERVICES_TRAINING_REFERENCE_TRAINER_H_
