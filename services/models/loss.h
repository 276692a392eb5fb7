// The training loss every stage, trainer and profiler shares: cross entropy of
// class scores [N, C] against labels [N], or of a language model's scores at
// every position [B, T, V] against the next bytes [B, T] (docs/text.md).
#ifndef STAGEWISE_SERVICES_MODELS_LOSS_H_
#define STAGEWISE_SERVICES_MODELS_LOSS_H_

#include <torch/types.h>

#include <cstdint>

namespace stagewise::models {

// The mean over every target (sum = false) or the sum.
torch::Tensor CrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                           bool sum = false);
// Targets whose highest score is the right one.
int64_t CountCorrect(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_LOSS_H_
