#include "services/training/optimizer.h"

#include <cmath>
#include <vector>

namespace stagewise::training {

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerSpec& spec,
                                                       torch::nn::Module& module) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    (spec.exclude_bn_and_bias && p.dim() <= 1 ? no_decay : decay).push_back(p);
  }
  if (spec.name == OptimizerKind::kAdam) {
    auto make = [&](double wd) {
      return std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(spec.lr)
                                                             .betas({spec.beta1, spec.beta2})
                                                             .eps(spec.eps)
                                                             .weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, make(spec.weight_decay));
    if (!no_decay.empty()) groups.emplace_back(no_decay, make(0.0));
    return std::make_unique<torch::optim::Adam>(std::move(groups),
                                                torch::optim::AdamOptions(spec.lr));
  }
  auto make = [&](double wd) {
    return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(spec.lr)
                                                          .momentum(spec.momentum)
                                                          .nesterov(spec.nesterov)
                                                          .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, make(spec.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, make(0.0));
  return std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(spec.lr));
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double BaseLearningRate(const OptimizerSpec& spec, int64_t batch_size, int64_t accumulation) {
  if (!spec.scale_lr_by_batch) return spec.lr;
  return spec.lr * static_cast<double>(batch_size * accumulation) / 256.0;
}

double LearningRateAt(const ScheduleSpec& schedule, double base_lr, int64_t step,
                      int64_t steps_per_epoch, int64_t total_steps) {
  const auto warmup = static_cast<int64_t>(std::llround(schedule.warmup_epochs * steps_per_epoch));
  if (step < warmup) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (schedule.name == LrScheduleKind::kMultistep) {
    double lr = base_lr;
    const double epoch = static_cast<double>(step) / static_cast<double>(steps_per_epoch);
    for (double m : schedule.milestones) {
      if (epoch >= m) lr *= schedule.gamma;
    }
    return lr;
  }
  if (schedule.name == LrScheduleKind::kCosine) {
    const double span = static_cast<double>(std::max<int64_t>(total_steps - warmup, 1));
    const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
    return schedule.min_lr + 0.5 * (base_lr - schedule.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  return base_lr;
}

}  // namespace stagewise::training
