#include "tests/unit/fake_stage_context.h"

#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/status_macros.h"
#include "services/data/sizes.h"
#include "services/models/model.h"
#include "services/models/plan.h"
#include "services/training/optimizer.h"

namespace stagewise::testing {

// One phase, from its start or from a resumed checkpoint (first_step_).
worker::PhaseWindow FakeStageContext::window() const {
  worker::PhaseWindow w;
  w.steps_per_epoch = steps_per_epoch_;
  w.total_steps = total_steps_;
  w.first_step = first_step_;
  w.base_lr = base_lr_;
  return w;
}

bool FakeStageContext::CheckpointDue(int64_t steps_done) const {
  return checkpoint_every_ > 0 && steps_done > 0 && steps_done < total_steps_ &&
         steps_done % checkpoint_every_ == 0;
}

absl::Status FakeStageContext::Checkpoint(int64_t steps_done) {
  if (!CheckpointDue(steps_done)) {
    return absl::InternalError(absl::StrCat("stage ", place_.stage, ": checkpoint after step ",
                                            steps_done, " is not due"));
  }
  if (algorithm_ == nullptr) {
    return absl::InternalError(absl::StrCat("stage ", place_.stage, ": checkpoint outside Run"));
  }
  // The stage runtime's shard format (services/checkpoint/shard_archive.h).
  checkpoint::ShardPosition at;
  at.step = steps_done;
  at.phase_step = steps_done;
  at.stage = place_.stage;
  checkpoint::ShardExtras extras;
  extras.algorithm = [this](torch::serialize::OutputArchive& archive) {
    return algorithm_->SaveState(*this, archive);
  };
  extras.wire_residuals = [this](auto& archive) { return wire_residuals_.Save(archive); };
  STAGEWISE_ASSIGN_OR_RETURN(const std::string shard,
                             checkpoint::SerializeShard(at, *model_, *optimizer_, extras));
  return job_->AddShard(steps_done, place_.stage, shard);
}

absl::StatusOr<v1::StageMessage> FakeStageContext::Receive(MessageQueue* queue) {
  std::optional<v1::StageMessage> m = queue->Pop();
  if (m.has_value()) return std::move(*m);
  absl::Status why = job_->failure();
  return why.ok() ? absl::CancelledError("stopped") : why;
}

absl::StatusOr<v1::StageMessage> FakeStageContext::ReceiveFrom(worker::Side side) {
  if (side == worker::Side::kPrev) {
    if (from_prev_ == nullptr)
      return absl::FailedPreconditionError("stage 0 has no previous stage");
    return Receive(from_prev_);
  }
  if (from_next_ == nullptr) {
    return absl::FailedPreconditionError("the last stage has no next stage");
  }
  return Receive(from_next_);
}

absl::Status FakeStageContext::SendTo(worker::Side side, v1::StageMessage message) {
  MessageQueue* to = side == worker::Side::kNext ? to_next_ : to_prev_;
  if (to == nullptr) {
    return absl::FailedPreconditionError(side == worker::Side::kNext
                                             ? "the last stage has no next stage"
                                             : "stage 0 has no previous stage");
  }
  message.set_job_id(place_.job_id);
  if (to->Push(std::move(message))) return absl::OkStatus();
  absl::Status why = job_->failure();
  return why.ok() ? absl::CancelledError("stopped") : why;
}

absl::Status FakeStageContext::Interrupted() const { return job_->failure(); }

void FakeStageContext::ReportStep(int64_t steps_done, double train_loss, int64_t samples) {
  if (tracer_) tracer_->Advance(steps_done);
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
  STAGEWISE_ASSIGN_OR_RETURN(const int64_t steps_per_epoch, data::StepsPerEpoch(spec));
  const int64_t total_steps = data::PhaseSteps(phase, steps_per_epoch);
  const double base_lr =
      training::BaseLearningRate(phase.optimizer, batch, AccumulationFactor(phase.algorithm));

  // Stage 0's data, sampled as StageRuntime::Create does.
  STAGEWISE_ASSIGN_OR_RETURN(job->data_,
                             data::LoadDatasets(spec.data, static_cast<uint64_t>(spec.seed)));
  job->train_ = std::make_unique<data::BatchSampler>(job->data_.train,
                                                     data::TrainSamplerOptions(spec, job->data_));
  job->test_ = std::make_unique<data::BatchSampler>(job->data_.test,
                                                    data::TestSamplerOptions(spec, job->data_));

  STAGEWISE_ASSIGN_OR_RETURN(auto plan, models::PlanModel(spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(auto ranges, models::ResolvePartition(spec.stages, plan));
  const int J = static_cast<int>(ranges.size());
  STAGEWISE_ASSIGN_OR_RETURN(job->metrics_server_, metrics::MetricsServer::Start(""));
  for (int j = 0; j + 1 < J; ++j) {
    job->forward_.push_back(std::make_unique<MessageQueue>(queue_capacity));
    job->backward_.push_back(std::make_unique<MessageQueue>(queue_capacity));
  }
  // Interleaved: worker w holds stages w, w + W, ...; they take its turns.
  const int W = J / std::max(1, spec.stages.chunks_per_worker);
  if (spec.stages.chunks_per_worker > 1) {
    for (int w = 0; w < W; ++w) job->turns_.push_back(std::make_unique<worker::DeviceTurns>());
  }
  for (int j = 0; j < J; ++j) {
    std::unique_ptr<FakeStageContext> s(new FakeStageContext());
    if (!job->turns_.empty()) s->turns_ = job->turns_[j % W].get();
    s->job_ = job.get();
    s->spec_ = spec;
    s->place_.job_id = "fake-job";
    s->place_.stage = j;
    s->place_.num_stages = J;
    s->place_.batch_size = spec.batch_size;
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
    s->metrics_ = std::make_unique<metrics::StageMetrics>(
        job->metrics_server_->registry(), s->place_.job_id, j, spec.algorithm.name());
    if (spec.trace.enabled) {
      s->tracer_ =
          std::make_unique<worker::Tracer>(spec.trace.from, spec.trace.to, spec.trace.max_spans);
    }
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

absl::Status FakeJob::AddShard(int64_t steps_done, int stage, std::string shard) {
  absl::MutexLock lock(&mu_);
  FakeCheckpoint& checkpoint = checkpoints_[steps_done];
  checkpoint.resize(stages_.size());
  if (!checkpoint.at(stage).empty()) {
    return absl::InternalError(
        absl::StrCat("stage ", stage, ": checkpoint after step ", steps_done, " taken twice"));
  }
  checkpoint[stage] = std::move(shard);
  return absl::OkStatus();
}

void FakeJob::set_checkpoint_every(int64_t every) {
  for (auto& s : stages_) s->checkpoint_every_ = every;
}

std::map<int64_t, FakeCheckpoint> FakeJob::checkpoints() const {
  absl::MutexLock lock(&mu_);
  return checkpoints_;
}

namespace {

// A copy of `in` with every floating-point tensor zeroed (nested archives
// too); integers, integer tensors and other values are kept.
void ZeroedCopy(torch::serialize::InputArchive& in, torch::serialize::OutputArchive& out) {
  for (const std::string& key : in.keys()) {
    c10::IValue value;
    in.read(key, value);
    if (value.isObject()) {
      torch::serialize::InputArchive nested_in;
      in.read(key, nested_in);
      torch::serialize::OutputArchive nested_out;
      ZeroedCopy(nested_in, nested_out);
      out.write(key, nested_out);
    } else if (value.isTensor()) {
      const torch::Tensor t = value.toTensor().detach();
      out.write(key, t.is_floating_point() ? torch::zeros_like(t) : t.clone());
    } else if (key != "training") {
      out.write(key, value);
    }
  }
}

}  // namespace

absl::Status FakeJob::Resume(const FakeCheckpoint& checkpoint, int64_t step, AlgorithmState state) {
  if (checkpoint.size() != stages_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint has ", checkpoint.size(),
                                                   " shards for ", stages_.size(), " stages"));
  }
  for (size_t j = 0; j < stages_.size(); ++j) {
    FakeStageContext& s = *stages_[j];
    if (step <= 0 || step >= s.total_steps_) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume step ", step, " outside (0, ", s.total_steps_, ")"));
    }
    if (checkpoint[j].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint has no shard for stage ", j));
    }
    try {
      STAGEWISE_ASSIGN_OR_RETURN(
          std::unique_ptr<checkpoint::ShardReader> shard,
          checkpoint::ShardReader::Parse(checkpoint[j], torch::kCPU,
                                         absl::StrCat("stage ", j, "'s shard")));
      if (shard->position().step != step) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage ", j, "'s shard was taken after step ", shard->position().step, ", not ", step));
      }
      STAGEWISE_RETURN_IF_ERROR(shard->LoadModel(*s.model_));
      STAGEWISE_RETURN_IF_ERROR(shard->LoadOptimizer(*s.optimizer_));
      if (torch::serialize::InputArchive residuals; shard->WireResiduals(residuals)) {
        STAGEWISE_RETURN_IF_ERROR(s.wire_residuals_.Load(residuals, torch::kCPU));
      }
      s.resume_state_.reset();
      if (state != AlgorithmState::kNone) {
        std::unique_ptr<torch::serialize::InputArchive> algorithm = shard->Algorithm();
        if (state == AlgorithmState::kZeroed) {
          torch::serialize::OutputArchive zeroed;
          ZeroedCopy(*algorithm, zeroed);
          std::ostringstream out;
          zeroed.save_to(out);
          std::istringstream back(out.str());
          algorithm = std::make_unique<torch::serialize::InputArchive>();
          algorithm->load_from(back);
        }
        s.resume_state_ = std::move(algorithm);
      }
      s.resume_shard_ = std::move(shard);
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat("stage ", j, "'s shard: ", e.what()));
    }
    s.first_step_ = step;
  }
  return absl::OkStatus();
}

void FakeJob::Stop(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = why;
  }
  for (auto& q : forward_) q->Close();
  for (auto& q : backward_) q->Close();
  for (auto& t : turns_) t->Cancel(why);
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
        std::unique_ptr<worker::Algorithm> algorithm = worker::MakeAlgorithm(ctx.spec().algorithm);
        ctx.algorithm_ = algorithm.get();
        status = algorithm->Run(ctx);
      } catch (const std::exception& e) {
        status = absl::InternalError(absl::StrCat("stage ", ctx.stage(), ": ", e.what()));
      }
      ctx.algorithm_ = nullptr;
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

std::vector<torch::Tensor> FakeJob::Buffers() const {
  std::vector<torch::Tensor> out;
  for (const auto& s : stages_) {
    for (const auto& b : s->model_->buffers()) out.push_back(b.detach().clone());
  }
  return out;
}

}  // namespace stagewise::testing
