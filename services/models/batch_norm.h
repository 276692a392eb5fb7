// BatchNorm whose running-statistics update can be switched off per thread.
// PETRA's forward uses batch statistics without touching running statistics;
// they are updated during the backward recomputation instead
// (docs/algorithms.md, "petra").
#ifndef STAGEWISE_SERVICES_MODELS_BATCH_NORM_H_
#define STAGEWISE_SERVICES_MODELS_BATCH_NORM_H_

#include <torch/nn/module.h>
#include <torch/types.h>

namespace stagewise::models {

// While alive, BatchNorm layers on this thread normalise with batch statistics
// in training mode but leave running_mean/var/num_batches_tracked unchanged.
class FreezeRunningStats {
 public:
  FreezeRunningStats();
  ~FreezeRunningStats();
  FreezeRunningStats(const FreezeRunningStats&) = delete;
  FreezeRunningStats& operator=(const FreezeRunningStats&) = delete;
  static bool active();

 private:
  bool previous_;
};

class BatchNormImpl : public torch::nn::Module {
 public:
  explicit BatchNormImpl(int64_t channels, double momentum = 0.1, double eps = 1e-5);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  double momentum_;
  double eps_;
};
TORCH_MODULE(BatchNorm);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_BATCH_NORM_H_
