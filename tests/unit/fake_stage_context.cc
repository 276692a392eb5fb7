#include "tests/unit/fake_stage_context.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "services/data/sizes.h"
#include "services/models/model.h"
#include "services/models/plan.h"
#include "services/training/optimizer.h"

namespace stagewise::testing {

double FakeStageContext::LearningRate(int64_t step) const {
  return training::LearningRateAt(spec_.schedule, base_lr_, step, steps_per_epoch_, total_steps_);
}

// As StageRuntime::EvalDue for a single phase.
bool FakeStageContext::EvalDue(int64_t steps_done) const {
  const EvalSpec& e = spec_.eval;
  if (steps_done == total_steps_) return e.at_end || e.every_epochs > 0 || e.every_steps > 0;
  if (e.every_steps > 0 && steps_done % e.every_steps == 0) return true;
  return e.every_epochs > 0 && steps_done % (e.every_epochs * steps_per_epoch_) == 0;
}

data::Batch FakeStageContext::TrainBatch(int64_t step) const {
  return train_->Get(step / steps_per_epoch_, step % steps_per_epoch_);
}

absl::StatusOr<v1::StageMessage> FakeStageContext::Receive(MessageQueue* queue) {
  std::optional<v1::StageMessage> m = queue->Pop();
  if (m.has_value()) return std::move(*m);
  absl::Status why = job_->failure();
  return why.ok() ? absl::CancelledError("stopped") : why;
}

absl::StatusOr<v1::StageMessage> FakeStageContext::ReceiveFromPrev() {
  if (from_prev_ == nullptr) return absl::FailedPreconditionError("stage 0 has no previous stage");
  return Receive(from_prev_);
}

absl::StatusOr<v1::StageMessage> FakeStageContext::ReceiveFromNext() {
  if (from_next_ == nullptr) {
    return absl::FailedPreconditionError("the last stage has no next stage");
  }
  return Receive(from_next_);
}

absl::Status FakeStageContext::SendToNext(v1::StageMessage message) {
  if (to_next_ == nullptr) return absl::FailedPreconditionError("the last stage has no next stage");
  message.set_job_id(job_id_);
  if (to_next_->Push(std::move(message))) return absl::OkStatus();
  absl::Status why = job_->failure();
  return why.ok() ? absl::CancelledError("stopped") : why;
}

absl::Status FakeStageContext::SendToPrev(v1::StageMessage message) {
  if (to_prev_ == nullptr) return absl::FailedPreconditionError("stage 0 has no previous stage");
  message.set_job_id(job_id_);
  if (to_prev_->Push(std::move(message))) return absl::OkStatus();
  absl::Status why = job_->failure();
  return why.ok() ? absl::CancelledError("stopped") : why;
}

absl::Status FakeStageContext::Interrupted() const { return job_->failure(); }

void FakeStageContext::ReportStep(int64_t steps_done, double train_loss, int64_t samples) {
  absl::MutexLock lock(&mu_);
  steps_.push_back({steps_done, train_loss, samples});
}

void FakeStageContext::ReportEval(int64_t steps_done, double loss, double accuracy,
                                  int64_t samples) {
  absl::MutexLock lock(&mu_);
  evals_.push_back({steps_done, loss, accuracy, samples});
}

void FakeStageContext::Summarize(const std::string& key, double value) {
  absl::MutexLock lock(&mu_);
  summary_[key] = value;
}

std::map<std::string, double> FakeStageContext::summary() const {
  absl::MutexLock lock(&mu_);
  return summary_;
}

std::vector<StepReport> FakeStageContext::steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

std::vector<EvalReport> FakeStageContext::evals() const {
  absl::MutexLock lock(&mu_);
  return evals_;
}

absl::StatusOr<std::unique_ptr<FakeJob>> FakeJob::FromYaml(const std::string& yaml,
                                                           size_t queue_capacity) {
  STAGEWISE_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(yaml));
  return Create(spec, queue_capacity);
}

absl::StatusOr<std::unique_ptr<FakeJob>> FakeJob::Create(const JobSpec& job_spec,
                                                         size_t queue_capacity) {
  std::unique_ptr<FakeJob> job(new FakeJob());
  // The first phase's settings, as StageRuntime::EnterPhase(0) applies them.
  JobSpec spec = job_spec;
  const PhaseSpec phase = Phases(spec).at(0);
  spec.algorithm = phase.algorithm;
  spec.optimizer = phase.optimizer;
  spec.schedule = phase.schedule;
  const int64_t batch = spec.batch_size;
  const int64_t steps_per_epoch = data::NominalTrainSize(spec.data) / batch;
  if (steps_per_epoch < 1) return absl::InvalidArgumentError("batch_size: larger than the data");
  const int64_t total_steps = data::PhaseSteps(phase, steps_per_epoch);
  const double base_lr =
      training::BaseLearningRate(phase.optimizer, batch, AccumulationFactor(phase.algorithm));

  // Stage 0's data, sampled as StageRuntime::Create does.
  STAGEWISE_ASSIGN_OR_RETURN(job->data_,
                             data::LoadDatasets(spec.data, static_cast<uint64_t>(spec.seed)));
  data::SamplerOptions train;
  train.batch_size = batch;
  train.seed = static_cast<uint64_t>(spec.seed);
  train.augment = spec.data.augment;
  train.crop_padding = spec.data.crop_padding;
  train.horizontal_flip = spec.data.horizontal_flip;
  if (spec.data.normalize) {
    train.mean = job->data_.mean;
    train.std = job->data_.std;
  }
  data::SamplerOptions test = train;
  test.batch_size = spec.eval_batch_size > 0 ? spec.eval_batch_size : batch;
  test.shuffle = false;
  test.drop_last = false;
  test.augment = false;
  job->train_ = std::make_unique<data::BatchSampler>(job->data_.train, train);
  job->test_ = std::make_unique<data::BatchSampler>(job->data_.test, test);

  STAGEWISE_ASSIGN_OR_RETURN(auto plan, models::PlanModel(spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(auto ranges,
                             models::ResolvePartition(spec.stages, static_cast<int>(plan.size())));
  const int J = static_cast<int>(ranges.size());
  STAGEWISE_ASSIGN_OR_RETURN(job->metrics_server_, metrics::MetricsServer::Start(""));
  for (int j = 0; j + 1 < J; ++j) {
    job->forward_.push_back(std::make_unique<MessageQueue>(queue_capacity));
    job->backward_.push_back(std::make_unique<MessageQueue>(queue_capacity));
  }
  for (int j = 0; j < J; ++j) {
    std::unique_ptr<FakeStageContext> s(new FakeStageContext());
    s->job_ = job.get();
    s->spec_ = spec;
    s->stage_ = j;
    s->num_stages_ = J;
    STAGEWISE_ASSIGN_OR_RETURN(
        s->model_, models::BuildModel(spec.model, static_cast<uint64_t>(spec.seed), ranges[j].first,
                                      ranges[j].second));
    s->model_->to(torch::kCPU);
    s->model_->train();
    s->optimizer_ = training::MakeOptimizer(phase.optimizer, *s->model_);
    s->steps_per_epoch_ = steps_per_epoch;
    s->total_steps_ = total_steps;
    s->base_lr_ = base_lr;
    s->train_ = job->train_.get();
    s->test_ = job->test_.get();
    if (j > 0) {
      s->from_prev_ = job->forward_[j - 1].get();
      s->to_prev_ = job->backward_[j - 1].get();
    }
    if (j + 1 < J) {
      s->to_next_ = job->forward_[j].get();
      s->from_next_ = job->backward_[j].get();
    }
    s->metrics_ = std::make_unique<metrics::StageMetrics>(job->metrics_server_->registry(),
                                                          s->job_id_, j, spec.algorithm.name);
    job->stages_.push_back(std::move(s));
  }
  return job;
}

FakeJob::~FakeJob() {
  // The stages' metrics go before the registry they live in.
  stages_.clear();
}

absl::Status FakeJob::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

void FakeJob::Stop(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = why;
  }
  for (auto& q : forward_) q->Close();
  for (auto& q : backward_) q->Close();
}

std::vector<absl::Status> FakeJob::Run(std::vector<int> stages) {
  if (stages.empty()) {
    for (int j = 0; j < num_stages(); ++j) stages.push_back(j);
  }
  std::vector<absl::Status> results(stages.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < stages.size(); ++i) {
    threads.emplace_back([this, &results, &stages, i] {
      FakeStageContext& ctx = stage(stages[i]);
      absl::Status status;
      try {
        auto algorithm = worker::MakeAlgorithm(ctx.spec().algorithm);
        status = algorithm.ok() ? (*algorithm)->Run(ctx) : algorithm.status();
      } catch (const std::exception& e) {
        status = absl::InternalError(absl::StrCat("stage ", ctx.stage(), ": ", e.what()));
      }
      if (!status.ok()) Stop(status);
      results[i] = status;
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<torch::Tensor> FakeJob::Parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& s : stages_) {
    for (const auto& p : s->model_->parameters()) out.push_back(p.detach().clone());
  }
  return out;
}

}  // namespace stagewise::testing
