#include "services/models/batch_norm.h"

#include <torch/torch.h>

namespace stagewise::models {
namespace {
thread_local bool freeze_running_stats = false;
}  // namespace

FreezeRunningStats::FreezeRunningStats() : previous_(freeze_running_stats) {
  freeze_running_stats = true;
}
FreezeRunningStats::~FreezeRunningStats() { freeze_running_stats = previous_; }
bool FreezeRunningStats::active() { return freeze_running_stats; }

BatchNormImpl::BatchNormImpl(int64_t channels, double momentum, double eps)
    : momentum_(momentum), eps_(eps) {
  weight = register_parameter("weight", torch::ones({channels}));
  bias = register_parameter("bias", torch::zeros({channels}));
  running_mean = register_buffer("running_mean", torch::zeros({channels}));
  running_var = register_buffer("running_var", torch::ones({channels}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& x) {
  if (is_training() && !FreezeRunningStats::active()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  // Undefined running tensors make batch_norm use batch statistics and skip
  // the running update; that is how a frozen training-mode pass works.
  const bool use_running = !is_training() || !FreezeRunningStats::active();
  torch::Tensor rm = use_running ? running_mean : torch::Tensor();
  torch::Tensor rv = use_running ? running_var : torch::Tensor();
  return torch::batch_norm(x, weight, bias, rm, rv, is_training(), momentum_, eps_,
                           /*cudnn_enabled=*/true);
}

}  // namespace stagewise::models
