// Optimizers and learning-rate schedules from a job spec. Shared by the
// reference trainer and every stage worker so both step identically.
#ifndef STAGEWISE_SERVICES_TRAINING_OPTIMIZER_H_
#define STAGEWISE_SERVICES_TRAINING_OPTIMIZER_H_

#include <torch/torch.h>

#include <memory>

#include "services/spec/job_spec.h"

namespace stagewise::training {

// How an optimizer steps its parameters: multi-tensor (_foreach_*) kernels,
// one launch per operation for all parameters of a group, or LibTorch's own
// loop, one per parameter. Both give the same results and the same state.
enum class OptimizerKernels { kMultiTensor, kPerParameter };

// SGD (momentum, Nesterov, weight decay), Adam or Muon over `module`'s
// parameters, a torch::optim::SGD or torch::optim::Adam (multi-tensor by
// default; Muon is an Adam whose weights of rank >= 2 step orthogonalised,
// docs/job_spec.md#optimizer; `kernels` does not apply to it).
// With exclude_bn_and_bias, parameters of rank <= 1 (biases, BN scale/shift)
// form a second group without weight decay (Goyal et al. 2017, PETRA Sec. 4.1).
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const OptimizerSpec& spec, torch::nn::Module& module,
    OptimizerKernels kernels = OptimizerKernels::kMultiTensor);

// Whether `optimizer` steps with multi-tensor kernels (made by MakeOptimizer
// with OptimizerKernels::kMultiTensor).
bool IsMultiTensor(const torch::optim::Optimizer& optimizer);

// Sets the learning rate of every parameter group (Muon's Adam part: at
// optimizer.adam_lr in the same proportion).
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Muon's orthogonalisation: `steps` Newton-Schulz iterations on the matrix
// normalised to unit Frobenius norm (float32; a tall matrix through its
// transpose). Exposed for tests.
torch::Tensor OrthogonalizeNewtonSchulz(const torch::Tensor& matrix, int steps);

// The peak learning rate: spec.lr, times batch_size * accumulation / 256 under
// the Goyal rule (scale_lr_by_batch).
double BaseLearningRate(const OptimizerSpec& spec, int64_t batch_size, int64_t accumulation = 1);

// Learning rate at optimizer step `step` (0-based): linear warm-up over
// warmup_epochs, then constant, multi-step (x gamma at each milestone epoch) or
// cosine decay to min_lr at total_steps.
double LearningRateAt(const ScheduleSpec& schedule, double base_lr, int64_t step,
                      int64_t steps_per_epoch, int64_t total_steps);

}  // namespace stagewise::training

#endif  // STAGEWISE_SERVICES_TRAINING_OPTIMIZER_H_
