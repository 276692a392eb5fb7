// Auxiliary-variable networks (AuxNet paper, Sun et al., Sec. 4.2;
// docs/references.md): a low-capacity network
// mapping the input of stage k-1 to (an estimate of) the input of stage k,
// lambda_k = AuxNet_{k-1}(lambda_{k-1}), with the main network's boundary shapes.
#ifndef STAGEWISE_SERVICES_MODELS_AUX_NET_H_
#define STAGEWISE_SERVICES_MODELS_AUX_NET_H_

#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/spec/enums.h"

namespace stagewise::models {

class AuxNetImpl : public torch::nn::Module {
 public:
  // `kind`: kResnet (strided conv3x3-BN-ReLU, then `blocks` basic residual
  // blocks) or kConv (the strided conv3x3-BN-ReLU alone). Shapes are per sample; image
  // boundaries [C,H,W] use convolutions (with an adaptive pool when the
  // stride cannot hit the size exactly), anything else a linear layer.
  AuxNetImpl(AuxNetArch kind, const std::vector<int64_t>& in_shape,
             const std::vector<int64_t>& out_shape, int blocks = 1);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  std::vector<int64_t> out_shape_;
  bool image_ = false;
  torch::nn::Sequential stem_{nullptr};
  std::vector<torch::nn::Sequential> bodies_;  // residual blocks (resnet kind)
  torch::nn::Linear linear_{nullptr};
};
TORCH_MODULE(AuxNet);

// Built from `seed` under the model-init lock; INVALID_ARGUMENT naming
// algorithm.auxnet_blocks for fewer than one block.
absl::StatusOr<AuxNet> MakeAuxNet(AuxNetArch kind, const std::vector<int64_t>& in_shape,
                                  const std::vector<int64_t>& out_shape, uint64_t seed,
                                  int blocks = 1);

// The seed of the AuxNet feeding the stage that starts at global block
// `first_block`.
uint64_t AuxNetSeed(uint64_t job_seed, int first_block);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_AUX_NET_H_
