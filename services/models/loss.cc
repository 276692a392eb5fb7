#include "services/models/loss.h"

#include <torch/torch.h>

namespace stagewise::models {
namespace {

// [B, T, V] scores and [B, T] targets as [B x T, V] and [B x T].
torch::Tensor Flat(const torch::Tensor& logits) {
  return logits.dim() > 2 ? logits.reshape({-1, logits.size(-1)}) : logits;
}

}  // namespace

torch::Tensor CrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets, bool sum) {
  return torch::cross_entropy_loss(Flat(logits), targets.reshape({-1}), {},
                                   sum ? at::Reduction::Sum : at::Reduction::Mean);
}

int64_t CountCorrect(const torch::Tensor& logits, const torch::Tensor& targets) {
  return Flat(logits).argmax(1).eq(targets.reshape({-1})).sum().item<int64_t>();
}

}  // namespace stagewise::models
