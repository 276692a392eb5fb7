// Auxiliary classification heads for local losses (Interlocking
// Backpropagation, App. B.2; docs/references.md): predictions for the task
// straight from a stage's output.
#ifndef STAGEWISE_SERVICES_MODELS_AUX_HEAD_H_
#define STAGEWISE_SERVICES_MODELS_AUX_HEAD_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/spec/job_spec.h"

namespace stagewise::models {

class AuxHeadImpl : public torch::nn::Module {
 public:
  // `in_shape`: one sample of the stage output, without the batch dimension.
  AuxHeadImpl(const AuxHeadSpec& spec, const std::vector<int64_t>& in_shape, int64_t classes);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Sequential convs_{nullptr};
  torch::nn::Linear fc_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};  // sequences only
  bool image_ = false;
  // A text stage's output [T, width]: the head scores the next byte at every
  // position (LayerNorm + linear, a language-model head of its own).
  bool sequence_ = false;
};
TORCH_MODULE(AuxHead);

// Builds a head for a stage whose output has `in_shape`, initialised from
// `seed`; INVALID_ARGUMENT naming algorithm.aux_head when a conv head meets a
// non-image output.
absl::StatusOr<AuxHead> MakeAuxHead(const AuxHeadSpec& spec, const std::vector<int64_t>& in_shape,
                                    int64_t classes, uint64_t seed);

// The seed of the aux head after global block `last_block` for a job seeded
// `job_seed`: any partition with a stage ending there builds the same head.
uint64_t AuxHeadSeed(uint64_t job_seed, int last_block);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_AUX_HEAD_H_
