#include "services/training/optimizer.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "services/models/optimizer_state_key.h"

namespace stagewise::training {
namespace {

// LibTorch's Adam and SGD, stepped with multi-tensor (_foreach_*) kernels:
// one kernel launch per operation over all parameters of a group instead of
// one per parameter (on a GPU, launches dominate a stage's optimizer step).
// Same arithmetic in the same order, the same per-parameter state
// (AdamParamState, SGDParamState) under the same keys, so checkpoints,
// resharding and the serialized state are unchanged; results equal the
// per-parameter loop (tests/unit/training_test.cc).
// The loss of an optimizer step's closure (with gradients on), if any.
torch::Tensor Evaluate(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

class ForeachAdam final : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;

  torch::Tensor step(LossClosure closure = nullptr) override {
    for (const auto& group : param_groups_) {
      if (static_cast<const torch::optim::AdamOptions&>(group.options()).amsgrad()) {
        return torch::optim::Adam::step(std::move(closure));  // not multi-tensor
      }
    }
    const torch::Tensor loss = Evaluate(closure);
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
      const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
      std::vector<torch::Tensor> params, grads, avgs, squares;
      std::vector<at::Scalar> step_sizes, correction2_roots;
      for (const torch::Tensor& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state_[models::OptimizerStateKey(p)];
        if (slot == nullptr) {
          auto fresh = std::make_unique<torch::optim::AdamParamState>();
          fresh->step(0);
          fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          slot = std::move(fresh);
        }
        auto& state = static_cast<torch::optim::AdamParamState&>(*slot);
        state.step(state.step() + 1);
        const double correction1 = 1 - std::pow(beta1, state.step());
        const double correction2 = 1 - std::pow(beta2, state.step());
        params.push_back(p);
        grads.push_back(p.grad());
        avgs.push_back(state.exp_avg());
        squares.push_back(state.exp_avg_sq());
        step_sizes.emplace_back(-o.lr() / correction1);
        correction2_roots.emplace_back(std::sqrt(correction2));
      }
      if (params.empty()) continue;
      if (o.weight_decay() != 0) grads = at::_foreach_add(grads, params, o.weight_decay());
      at::_foreach_mul_(avgs, beta1);
      at::_foreach_add_(avgs, grads, 1 - beta1);
      at::_foreach_mul_(squares, beta2);
      at::_foreach_addcmul_(squares, grads, grads, 1 - beta2);
      std::vector<torch::Tensor> denom = at::_foreach_sqrt(squares);
      at::_foreach_div_(denom, correction2_roots);
      at::_foreach_add_(denom, o.eps());
      at::_foreach_addcdiv_(params, avgs, denom, step_sizes);
    }
    return loss;
  }
};

class ForeachSgd final : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;

  torch::Tensor step(LossClosure closure = nullptr) override {
    const torch::Tensor loss = Evaluate(closure);
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      std::vector<torch::Tensor> params, grads;
      for (const torch::Tensor& p : group.params()) {
        if (!p.grad().defined()) continue;
        params.push_back(p);
        grads.push_back(p.grad());
      }
      if (params.empty()) continue;
      if (o.weight_decay() != 0) grads = at::_foreach_add(grads, params, o.weight_decay());
      std::vector<torch::Tensor> updates = grads;
      if (o.momentum() != 0) {
        // A parameter's first step starts its buffer at its gradient; the
        // others decay theirs and add it.
        std::vector<torch::Tensor> buffers, buffer_grads;
        for (size_t i = 0; i < params.size(); ++i) {
          auto& slot = state_[models::OptimizerStateKey(params[i])];
          if (slot == nullptr) {
            auto fresh = std::make_unique<torch::optim::SGDParamState>();
            fresh->momentum_buffer(torch::clone(grads[i]).detach());
            updates[i] = fresh->momentum_buffer();
            slot = std::move(fresh);
            continue;
          }
          auto& state = static_cast<torch::optim::SGDParamState&>(*slot);
          buffers.push_back(state.momentum_buffer());
          buffer_grads.push_back(grads[i]);
          updates[i] = state.momentum_buffer();
        }
        if (!buffers.empty()) {
          at::_foreach_mul_(buffers, o.momentum());
          at::_foreach_add_(buffers, buffer_grads, 1 - o.dampening());
        }
        if (o.nesterov()) updates = at::_foreach_add(grads, updates, o.momentum());
      }
      at::_foreach_add_(params, updates, -o.lr());
    }
    return loss;
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerSpec& spec,
                                                       torch::nn::Module& module,
                                                       OptimizerKernels kernels) {
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
    if (kernels == OptimizerKernels::kPerParameter) {
      return std::make_unique<torch::optim::Adam>(std::move(groups),
                                                  torch::optim::AdamOptions(spec.lr));
    }
    return std::make_unique<ForeachAdam>(std::move(groups), torch::optim::AdamOptions(spec.lr));
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
  if (kernels == OptimizerKernels::kPerParameter) {
    return std::make_unique<torch::optim::SGD>(std::move(groups),
                                               torch::optim::SGDOptions(spec.lr));
  }
  return std::make_unique<ForeachSgd>(std::move(groups), torch::optim::SGDOptions(spec.lr));
}

bool IsMultiTensor(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const ForeachAdam*>(&optimizer) != nullptr ||
         dynamic_cast<const ForeachSgd*>(&optimizer) != nullptr;
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
