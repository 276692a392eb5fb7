#include "worker/algorithms/delay_corrections.h"

#include <algorithm>
#include <cmath>
#include <utility>

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

absl::Status DelayCorrections::Step(StageContext& ctx, int64_t t, double lr) {
  if (options_.predict_weights && staleness_ > 0) {
    torch::NoGradGuard no_grad;
    if (previous_.empty()) {
      for (const auto& p : params_) previous_.push_back(p.detach().clone());
    } else {
      for (size_t i = 0; i < params_.size(); ++i) previous_[i].copy_(params_[i]);
    }
  }
  std::vector<double> momenta;  // compensate: the groups' own, put back after the step
  if (options_.momentum_by_delay == DelayMomentum::kCompensate && staleness_ > 0) {
    for (auto& group : ctx.optimizer().param_groups()) {
      auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&group.options());
      if (sgd == nullptr) continue;
      momenta.push_back(sgd->momentum());
      sgd->momentum(std::max(0.0, sgd->momentum() - staleness_ / (1 + staleness_)));
    }
  }
  absl::Status stepped = StepOptimizer(ctx, t, lr * lr_scale());
  if (!momenta.empty()) {
    size_t i = 0;
    for (auto& group : ctx.optimizer().param_groups()) {
      auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&group.options());
      if (sgd != nullptr) sgd->momentum(momenta[i++]);
    }
  }
  return stepped;
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

}  // namespace stagewise::worker
