#include "services/models/split_pass.h"

#include <utility>

namespace stagewise::models {

SplitPass SplitPass::Forward(const std::vector<std::shared_ptr<Block>>& blocks,
                             const torch::Tensor& input) {
  SplitPass pass;
  pass.blocks_ = blocks;
  pass.input_ = input;
  torch::Tensor h = input;
  for (const auto& b : blocks) {
    h = b->forward(h);
    pass.outputs_.push_back(h);
  }
  if (blocks.empty()) pass.outputs_.push_back(input);
  return pass;
}

torch::Tensor SplitPass::BackwardInput(const torch::Tensor& root, const torch::Tensor& root_grad) {
  const size_t K = blocks_.size();
  grads_.assign(K, torch::Tensor());
  // Wanted: the stage input and every block output that carries a gradient;
  // the output itself when it is the root (its gradient is root_grad).
  std::vector<torch::Tensor> wanted;
  std::vector<int> slot;  // -1: the input, else the block whose output it is
  if (input_.requires_grad()) {
    wanted.push_back(input_);
    slot.push_back(-1);
  }
  const bool root_is_output = root_grad.defined();
  for (size_t k = 0; k < K; ++k) {
    if (root_is_output && k + 1 == K) {
      grads_[k] = root_grad;
      continue;
    }
    if (outputs_[k].requires_grad()) {
      wanted.push_back(outputs_[k]);
      slot.push_back(static_cast<int>(k));
    }
  }
  torch::Tensor input_grad;
  if (wanted.empty() || !root.requires_grad()) return input_grad;
  std::vector<torch::Tensor> root_grads;
  if (root_is_output) root_grads.push_back(root_grad);
  std::vector<torch::Tensor> got =
      torch::autograd::grad({root}, wanted, root_grads, /*retain_graph=*/true,
                            /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t i = 0; i < got.size(); ++i) {
    if (slot[i] < 0) {
      input_grad = got[i];
    } else {
      grads_[static_cast<size_t>(slot[i])] = got[i];
    }
  }
  return input_grad;
}

void SplitPass::BackwardWeight() {
  for (size_t k = 0; k < blocks_.size(); ++k) {
    std::vector<torch::Tensor> params;
    for (const auto& p : blocks_[k]->parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    if (params.empty() || !grads_[k].defined() || !outputs_[k].requires_grad()) continue;
    torch::autograd::backward({outputs_[k]}, {grads_[k]}, /*retain_graph=*/false,
                              /*create_graph=*/false, params);
  }
  outputs_.clear();
  grads_.clear();
  input_ = torch::Tensor();
}

}  // namespace stagewise::models
