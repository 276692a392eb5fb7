#include "services/training/reference_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/checkpoint/checkpoint.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/status_macros.h"
#include "services/models/loss.h"
#include "services/training/loss_window.h"
#include "services/training/optimizer.h"

namespace stagewise::training {
namespace fs = std::filesystem;

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(const JobSpec& spec) {
  std::unique_ptr<ReferenceTrainer> t(new ReferenceTrainer());
  t->spec_ = spec;
  try {
    t->device_ = torch::Device(spec.device);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("device: '", spec.device, "' is not a device"));
  }
  if (t->device_.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device: ", spec.device, " requested but this LibTorch sees no CUDA device"));
  }
  auto data = data::LoadDatasets(spec.data, static_cast<uint64_t>(spec.seed));
  if (!data.ok()) return data.status();
  t->data_ = std::move(*data);

  t->train_ = std::make_unique<data::BatchSampler>(t->data_.train,
                                                   data::TrainSamplerOptions(spec, t->data_));
  t->test_ =
      std::make_unique<data::BatchSampler>(t->data_.test, data::TestSamplerOptions(spec, t->data_));
  if (t->train_->batches_per_epoch() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size: ", spec.batch_size,
                                                   " is larger than the training set (",
                                                   t->data_.train.size(), " samples)"));
  }

  auto model = models::BuildModel(spec.model, static_cast<uint64_t>(spec.seed));
  if (!model.ok()) return model.status();
  t->model_ = *model;
  try {
    t->model_->to(t->device_);
    t->optimizer_ = MakeOptimizer(spec.optimizer, *t->model_);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("setting up the model: ", e.what()));
  }
  const int64_t per_epoch = t->train_->batches_per_epoch();
  t->total_steps_ = data::TotalSteps(spec, per_epoch);
  t->base_lr_ = BaseLearningRate(spec.optimizer, spec.batch_size);
  return t;
}

double ReferenceTrainer::Step(const data::Batch& batch, double lr) {
  model_->train();
  SetLearningRate(*optimizer_, lr);
  optimizer_->zero_grad();
  torch::Tensor logits = model_->forward(batch.x.to(device_));
  torch::Tensor loss = models::CrossEntropy(logits, batch.y.to(device_));
  loss.backward();
  optimizer_->step();
  return loss.item<double>();
}

EvalResult ReferenceTrainer::Evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  EvalResult r;
  r.step = step_;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < test_->batches_per_epoch(); ++i) {
    data::Batch b = test_->Get(0, i);
    torch::Tensor y = b.y.to(device_);
    torch::Tensor logits = model_->forward(b.x.to(device_));
    loss_sum += models::CrossEntropy(logits, y, /*sum=*/true).item<double>();
    correct += models::CountCorrect(logits, y);
    r.samples += y.numel();
  }
  model_->train();
  if (r.samples > 0) {
    r.loss = loss_sum / static_cast<double>(r.samples);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(r.samples);
  }
  return r;
}

// One stage holding every block: the shard a distributed job's stage writes
// (worker/stage_runtime.cc), so `stagewise export` reads both alike.
absl::StatusOr<std::string> ReferenceTrainer::SaveCheckpoint(const std::string& spec_yaml) const {
  const CheckpointSpec& c = spec_.checkpoint;
  const std::string step_dir = checkpoint::StepDir(c.dir, spec_.name, step_);
  checkpoint::ShardPosition at;
  at.step = step_;
  at.phase_step = step_;
  at.block_end = static_cast<int64_t>(model_->size());
  absl::StatusOr<std::string> bytes = checkpoint::SerializeShard(at, *model_, *optimizer_);
  if (!bytes.ok()) {
    return absl::InternalError(absl::StrCat(step_dir, ": ", bytes.status().message()));
  }
  const std::string& data = *bytes;
  const std::string file = checkpoint::ShardFileName(0);
  if (absl::Status s = checkpoint::WriteFileAtomically(step_dir + "/" + file, data); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checkpoint.dir: ", s.message()));
  }
  v1::CheckpointManifest manifest;
  manifest.set_format(checkpoint::kFormat);
  manifest.set_job_id(spec_.name);
  manifest.set_step(step_);
  manifest.set_phase(0);
  manifest.set_phase_step(step_);
  manifest.set_total_steps(total_steps_);
  manifest.set_created_unix_ms(NowUnixMs());
  manifest.set_job_spec_yaml(spec_yaml);
  v1::CheckpointShard* shard = manifest.add_shards();
  shard->set_stage(0);
  shard->set_file(file);
  shard->set_bytes(static_cast<int64_t>(data.size()));
  shard->set_crc32(checkpoint::Crc32(data));
  shard->set_block_begin(0);
  shard->set_block_end(static_cast<int32_t>(model_->size()));
  if (absl::Status s = checkpoint::WriteManifest(step_dir, manifest); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checkpoint.dir: ", s.message()));
  }
  return step_dir;
}

absl::Status ReferenceTrainer::LoadCheckpoint(const checkpoint::Committed& committed) {
  const v1::CheckpointShard& shard = committed.manifest.shards(0);
  const std::string path = committed.dir + "/" + shard.file();
  if (committed.manifest.shards_size() != 1 || shard.block_begin() != 0 ||
      shard.block_end() != static_cast<int32_t>(model_->size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        committed.dir, ": a checkpoint of ", committed.manifest.shards_size(),
        " stage(s); train-local resumes only its own single-stage checkpoints (start afresh with "
        "--no-resume, or use another checkpoint.dir)"));
  }
  absl::StatusOr<std::string> data = checkpoint::ReadFile(path);
  if (!data.ok()) return absl::DataLossError(data.status().message());
  STAGEWISE_RETURN_IF_ERROR(checkpoint::VerifyBytes(*data, shard.bytes(), shard.crc32(), path));
  STAGEWISE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardReader> reader,
                             checkpoint::ShardReader::Parse(*data, device_, path));
  STAGEWISE_RETURN_IF_ERROR(reader->LoadModel(*model_));
  STAGEWISE_RETURN_IF_ERROR(reader->LoadOptimizer(*optimizer_));
  step_ = reader->position().step;
  return absl::OkStatus();
}

absl::Status ReferenceTrainer::MaybeCheckpoint(bool force, const std::string& spec_yaml,
                                               std::string* written) {
  const CheckpointSpec& c = spec_.checkpoint;
  if (c.dir.empty()) return absl::OkStatus();
  const int64_t per_epoch = train_->batches_per_epoch();
  const bool due = force || data::CheckpointScheduled(c, step_, total_steps_, per_epoch);
  // The end of a run may fall on a scheduled checkpoint: no second copy.
  if (!due || *written == checkpoint::StepDir(c.dir, spec_.name, step_)) return absl::OkStatus();
  STAGEWISE_ASSIGN_OR_RETURN(*written, SaveCheckpoint(spec_yaml));
  return checkpoint::Prune(c.dir, spec_.name, c.keep).status();
}

absl::StatusOr<TrainResult> ReferenceTrainer::Run(const TrainOptions& options) {
  TrainResult result;
  result.num_parameters = model_->num_parameters();
  const int64_t per_epoch = train_->batches_per_epoch();
  if (options.resume && !spec_.checkpoint.dir.empty()) {
    std::vector<std::string> skipped;
    const std::vector<checkpoint::Committed> committed = checkpoint::ListCommitted(
        spec_.checkpoint.dir, spec_.name, /*verify_checksums=*/false, &skipped);
    if (!committed.empty()) STAGEWISE_RETURN_IF_ERROR(LoadCheckpoint(committed.front()));
  }
  const auto start = std::chrono::steady_clock::now();
  double eval_seconds = 0;
  auto window_start = start;
  double window_loss = 0;  // the progress lines': every log_every_steps
  int64_t window_steps = 0;
  LossWindow loss_window(start);  // the result's train_loss: as a distributed job's
  int64_t tokens = 0;             // text: targets trained on
  const int64_t first_step = step_;
  try {
    auto evaluate = [&]() {
      const auto t0 = std::chrono::steady_clock::now();
      EvalResult r = Evaluate();
      eval_seconds += Seconds(t0);
      result.evals.push_back(r);
      if (options.on_eval) options.on_eval(r);
    };
    while (step_ < total_steps_) {
      const double lr = LearningRateAt(spec_.schedule, base_lr_, step_, per_epoch, total_steps_);
      data::Batch batch = train_->Get(step_ / per_epoch, step_ % per_epoch);
      const double loss = Step(batch, lr);
      if (batch.y.dim() == 2) tokens += batch.y.numel();
      if (!std::isfinite(loss)) {
        return absl::AbortedError(absl::StrCat("training diverged: loss is ", loss, " at step ",
                                               step_, " (lower optimizer.lr?)"));
      }
      ++step_;
      window_loss += loss;
      ++window_steps;
      const bool last = step_ == total_steps_;
      if (const auto report = loss_window.Add(loss, last, LossWindow::Clock::now())) {
        result.train_loss = report->mean_loss;
      }
      if (step_ % options.log_every_steps == 0 || last) {
        if (options.on_progress) {
          Progress p;
          p.step = step_;
          p.total_steps = total_steps_;
          p.epoch = static_cast<double>(step_) / static_cast<double>(per_epoch);
          p.loss = window_loss / static_cast<double>(window_steps);
          p.lr = lr;
          p.elapsed_seconds = Seconds(start) - eval_seconds;
          const double window = Seconds(window_start);
          p.samples_per_second = window > 0 ? window_steps * spec_.batch_size / window : 0;
          const double per_step = p.elapsed_seconds / static_cast<double>(step_ - first_step);
          p.eta_seconds = per_step * static_cast<double>(total_steps_ - step_);
          options.on_progress(p);
        }
        window_loss = 0;
        window_steps = 0;
        window_start = std::chrono::steady_clock::now();
      }
      if (!last && data::EvalDue(spec_.eval, 0, total_steps_, step_, per_epoch)) evaluate();
      if (!last) {
        if (absl::Status s = MaybeCheckpoint(false, options.spec_yaml, &result.last_checkpoint);
            !s.ok())
          return s;
      }
    }
    result.seconds = Seconds(start) - eval_seconds;
    if (absl::Status s = MaybeCheckpoint(true, options.spec_yaml, &result.last_checkpoint); !s.ok())
      return s;
    if (data::EvalDue(spec_.eval, 0, total_steps_, total_steps_, per_epoch)) evaluate();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("training step ", step_, ": ", e.what()));
  }
  result.steps = step_;
  result.epochs = static_cast<double>(step_) / static_cast<double>(per_epoch);
  if (!result.evals.empty()) result.test = result.evals.back();
  const int64_t done = step_ - first_step;
  result.samples_per_second =
      result.seconds > 0 ? static_cast<double>(done * spec_.batch_size) / result.seconds : 0;
  result.tokens_per_second = result.seconds > 0 ? static_cast<double>(tokens) / result.seconds : 0;
  return result;
}

}  // namespace stagewise::training
