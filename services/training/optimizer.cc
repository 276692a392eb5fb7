#include "services/training/optimizer.h"

#include <algorithm>
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

using ParamStates =
    ska::flat_hash_map<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>;

// One Adam step of `group`'s parameters with gradients, multi-tensor.
void StepAdamGroup(torch::optim::OptimizerParamGroup& group, ParamStates& states) {
  const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  std::vector<torch::Tensor> params, grads, avgs, squares;
  std::vector<at::Scalar> step_sizes, correction2_roots;
  for (const torch::Tensor& p : group.params()) {
    if (!p.grad().defined()) continue;
    auto& slot = states[models::OptimizerStateKey(p)];
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
  if (params.empty()) return;
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
    for (auto& group : param_groups_) StepAdamGroup(group, state_);
    return loss;
  }
};

// Muon (Jordan et al. 2024; as torch.optim.Muon): for each weight of rank
// >= 2 (a convolution's flattened to out x rest), a momentum buffer
// B = mu B + g, the update B (or g + mu B with Nesterov) orthogonalised by
// `steps` Newton-Schulz iterations, decoupled weight decay, and a step of
// lr * sqrt(max(1, rows / cols)). The other parameters (biases, norms) take
// Adam steps at adam_lr. An Adam underneath, so the state is Adam's (the
// buffer in exp_avg, an empty exp_avg_sq for the weights) and checkpoints,
// resharding and the profiler's memory count need nothing new. The
// iterations run in float32 (the reference implementation's bfloat16 is a
// GPU speed choice).
class Muon final : public torch::optim::Adam {
 public:
  Muon(std::vector<torch::optim::OptimizerParamGroup> groups, std::vector<bool> orthogonal,
       const OptimizerSpec& spec)
      : torch::optim::Adam(std::move(groups), torch::optim::AdamOptions(spec.lr)),
        orthogonal_(std::move(orthogonal)),
        momentum_(spec.momentum),
        nesterov_(spec.nesterov),
        steps_(spec.newton_schulz_steps),
        adam_ratio_(spec.adam_lr > 0 && spec.lr > 0 ? spec.adam_lr / spec.lr : 1.0) {}

  void SetLearningRate(double lr) {
    for (size_t i = 0; i < param_groups_.size(); ++i) {
      param_groups_[i].options().set_lr(orthogonal_[i] ? lr : lr * adam_ratio_);
    }
  }

  torch::Tensor step(LossClosure closure = nullptr) override {
    const torch::Tensor loss = Evaluate(closure);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < param_groups_.size(); ++i) {
      if (!orthogonal_[i]) {
        StepAdamGroup(param_groups_[i], state_);
        continue;
      }
      const auto& o = static_cast<const torch::optim::AdamOptions&>(param_groups_[i].options());
      for (torch::Tensor& p : param_groups_[i].params()) {
        if (p.grad().defined()) StepWeight(p, o.lr(), o.weight_decay());
      }
    }
    return loss;
  }

 private:
  void StepWeight(torch::Tensor& p, double lr, double weight_decay) {
    auto& slot = state_[models::OptimizerStateKey(p)];
    if (slot == nullptr) {
      auto fresh = std::make_unique<torch::optim::AdamParamState>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::empty({0}, p.options()));
      slot = std::move(fresh);
    }
    auto& state = static_cast<torch::optim::AdamParamState&>(*slot);
    state.step(state.step() + 1);
    const torch::Tensor& g = p.grad();
    torch::Tensor buffer = state.exp_avg();
    buffer.mul_(momentum_).add_(g);
    const torch::Tensor update = nesterov_ ? g.add(buffer, momentum_) : buffer;
    const int64_t rows = p.size(0);
    const int64_t cols = p.numel() / std::max<int64_t>(rows, 1);
    const torch::Tensor orthogonal =
        OrthogonalizeNewtonSchulz(update.reshape({rows, cols}), steps_).view_as(p);
    const double scale =
        std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
    if (weight_decay != 0) p.mul_(1 - lr * weight_decay);
    p.add_(orthogonal.to(p.scalar_type()), -lr * scale);
  }

  const std::vector<bool> orthogonal_;  // per param group: Muon (true) or Adam
  const double momentum_;
  const bool nesterov_;
  const int steps_;
  const double adam_ratio_;  // the Adam part's lr over lr
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

torch::Tensor OrthogonalizeNewtonSchulz(const torch::Tensor& matrix, int steps) {
  // The quintic iteration's coefficients (Jordan et al.): they push every
  // singular value of the normalised matrix towards 1 in a few steps.
  constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;
  constexpr double kEps = 1e-7;
  torch::Tensor x = matrix.to(torch::kFloat32);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / x.norm().clamp_min(kEps);
  for (int i = 0; i < steps; ++i) {
    const torch::Tensor a = x.mm(x.t());
    const torch::Tensor b = kB * a + kC * a.mm(a);
    x = kA * x + b.mm(x);
  }
  return tall ? x.t().contiguous() : x;
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const OptimizerSpec& spec,
                                                       torch::nn::Module& module,
                                                       OptimizerKernels kernels) {
  if (spec.name == OptimizerKind::kMuon) {
    std::vector<torch::Tensor> weights, rest;
    for (const auto& p : module.parameters()) {
      if (p.requires_grad()) (p.dim() >= 2 ? weights : rest).push_back(p);
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    std::vector<bool> orthogonal;
    if (!weights.empty()) {
      groups.emplace_back(weights,
                          std::make_unique<torch::optim::AdamOptions>(
                              torch::optim::AdamOptions(spec.lr).weight_decay(spec.weight_decay)));
      orthogonal.push_back(true);
    }
    if (!rest.empty()) {
      const double lr = spec.adam_lr > 0 ? spec.adam_lr : spec.lr;
      groups.emplace_back(
          rest, std::make_unique<torch::optim::AdamOptions>(
                    torch::optim::AdamOptions(lr)
                        .betas({spec.beta1, spec.beta2})
                        .eps(spec.eps)
                        .weight_decay(spec.exclude_bn_and_bias ? 0.0 : spec.weight_decay)));
      orthogonal.push_back(false);
    }
    return std::make_unique<Muon>(std::move(groups), std::move(orthogonal), spec);
  }
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
         dynamic_cast<const ForeachSgd*>(&optimizer) != nullptr ||
         dynamic_cast<const Muon*>(&optimizer) != nullptr;
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  if (auto* muon = dynamic_cast<Muon*>(&optimizer)) {
    muon->SetLearningRate(lr);
    return;
  }
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
