#include "worker/algorithms/delay_corrections.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "worker/algorithms/common.h"

namespace stagewise::worker {

void DelayCorrections::Start(double staleness, std::vector<torch::Tensor> params) {
  staleness_ = staleness;
  params_ = std::move(params);
  previous_.clear();
}

double DelayCorrections::lr_scale() const {
  switch (options_.lr_by_delay) {
    case DelayLr::kInverse:
      return 1.0 / (1.0 + staleness_);
    case DelayLr::kInverseSqrt:
      return 1.0 / std::sqrt(1.0 + staleness_);
    case DelayLr::kConstant:
      break;
  }
  return 1.0;
}

int64_t DelayCorrections::held_bytes() const { return TensorBytes(previous_); }

void DelayCorrections::ReportHeld(StageContext& ctx) const {
  const int64_t bytes = held_bytes();
  ctx.stage_metrics().SetMemory("previous_parameters", bytes);
  ctx.Summarize("previous_parameter_bytes", static_cast<double>(bytes));
}

absl::Status DelayCorrections::Step(StageContext& ctx, int64_t t, double lr) {
  if (options_.predict_weights && staleness_ > 0) {
    torch::NoGradGuard no_grad;
    if (previous_.empty()) {
      for (const auto& p : params_) previous_.push_back(p.detach().clone());
      ReportHeld(ctx);
    } else {
      for (size_t i = 0; i < params_.size(); ++i) previous_[i].copy_(params_[i]);
    }
  }
  // compensate: each group's momentum (SGD's, Adam's beta1) lowered by the
  // delay's own for the step, and put back after it.
  std::vector<double> momenta;
  const bool compensate =
      options_.momentum_by_delay == DelayMomentum::kCompensate && staleness_ > 0;
  if (compensate) {
    for (auto& group : ctx.optimizer().param_groups()) {
      const double m = Momentum(group.options());
      momenta.push_back(m);
      SetMomentum(group.options(), std::max(0.0, m - staleness_ / (1 + staleness_)));
    }
  }
  absl::Status stepped = StepOptimizer(ctx, t, lr * lr_scale());
  if (compensate) {
    size_t i = 0;
    for (auto& group : ctx.optimizer().param_groups()) SetMomentum(group.options(), momenta[i++]);
  }
  return stepped;
}

double DelayCorrections::Momentum(torch::optim::OptimizerOptions& options) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) return sgd->momentum();
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    return std::get<0>(adam->betas());
  }
  return 0;  // another optimizer: nothing to lower (the spec refuses the option there)
}

void DelayCorrections::SetMomentum(torch::optim::OptimizerOptions& options, double momentum) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    sgd->momentum(momentum);
  } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    adam->betas({momentum, std::get<1>(adam->betas())});
  }
}

std::vector<torch::Tensor> DelayCorrections::Predict() {
  std::vector<torch::Tensor> current;
  if (!options_.predict_weights || previous_.empty() || staleness_ <= 0) return current;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    current.push_back(params_[i].detach().clone());
    params_[i].add_(params_[i] - previous_[i], staleness_);
  }
  return current;
}

void DelayCorrections::Restore(const std::vector<torch::Tensor>& saved) {
  if (saved.empty()) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(saved[i]);
}

void DelayCorrections::Save(torch::serialize::OutputArchive& archive) const {
  if (!options_.predict_weights) return;
  WriteStateInt(archive, "w_prev.count", static_cast<int64_t>(previous_.size()));
  for (size_t i = 0; i < previous_.size(); ++i) {
    WriteStateTensor(archive, absl::StrCat("w_prev.", i), previous_[i]);
  }
}

absl::Status DelayCorrections::Load(StageContext& ctx, torch::serialize::InputArchive& archive,
                                    const std::string& algorithm) {
  previous_.clear();
  if (!options_.predict_weights) return absl::OkStatus();
  c10::IValue count;
  try {
    if (!archive.try_read("w_prev.count", count)) return absl::OkStatus();
  } catch (const std::exception& e) {
    const std::string what = e.what();  // its first line (torch's carry a backtrace)
    return absl::DataLossError(
        absl::StrCat("resume state: ", algorithm, " w_prev: ", what.substr(0, what.find('\n'))));
  }
  if (!count.isInt()) {
    return absl::DataLossError(absl::StrCat(
        "resume state: ", algorithm, " w_prev.count is not an integer but a ", count.tagKind()));
  }
  if (count.toInt() != 0 && count.toInt() != static_cast<int64_t>(params_.size())) {
    return absl::DataLossError(absl::StrCat("resume state: ", algorithm, " saved w_prev for ",
                                            count.toInt(), " parameters, the stage has ",
                                            params_.size()));
  }
  std::vector<torch::Tensor> previous;
  for (int64_t i = 0; i < count.toInt(); ++i) {
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor w,
                               ReadStateTensor(archive, absl::StrCat("w_prev.", i), ctx.device()));
    if (!w.sizes().equals(params_[i].sizes())) {
      return absl::DataLossError(absl::StrCat("resume state: ", algorithm, " w_prev.", i,
                                              " has shape ", c10::str(w.sizes()),
                                              ", the parameter ", c10::str(params_[i].sizes())));
    }
    previous.push_back(w.to(params_[i].dtype()));
  }
  previous_ = std::move(previous);
  if (!previous_.empty()) ReportHeld(ctx);
  return absl::OkStatus();
}

}  // namespace stagewise::worker
