// A stage's forward kept block by block, so that its backward can run in two
// parts, as the zero-bubble schedules need (Qi et al., Zero Bubble Pipeline
// Parallelism, 2023; docs/algorithms.md, backprop):
//  - B, the input gradient: one autograd pass from the output's gradient to
//    the stage input and to every block boundary, computing no parameter
//    gradient (the engine skips the weight-gradient edges it is not asked
//    for); the graph is kept;
//  - W, the weight gradients, later: block by block, from the gradient B left
//    at the block's output to the block's own parameters only, so the
//    work across blocks is not repeated (inside a block, the path from its
//    output to an earlier layer's weights is walked again).
// B then W accumulate exactly the gradients of one fused backward.
#ifndef STAGEWISE_SERVICES_MODELS_SPLIT_PASS_H_
#define STAGEWISE_SERVICES_MODELS_SPLIT_PASS_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "services/models/block.h"

namespace stagewise::models {

class SplitPass {
 public:
  SplitPass() = default;
  // Runs `blocks` on `input` with a graph, keeping every block's output.
  // `input` is the stage input: a leaf that requires grad where the input
  // gradient is wanted.
  static SplitPass Forward(const std::vector<std::shared_ptr<Block>>& blocks,
                           const torch::Tensor& input);

  const torch::Tensor& output() const { return outputs_.back(); }
  bool empty() const { return outputs_.empty(); }

  // B: from `root` (the output, with `root_grad`; or a scalar loss computed
  // from the output, with an undefined `root_grad`), the gradient at every
  // block boundary. Returns the input gradient (undefined when the input
  // does not require grad). Keeps the graph for BackwardWeight.
  torch::Tensor BackwardInput(const torch::Tensor& root, const torch::Tensor& root_grad);

  // W: every block's parameter gradients accumulate into .grad from the
  // gradients BackwardInput left; frees the graph. Once, after BackwardInput.
  void BackwardWeight();

 private:
  std::vector<std::shared_ptr<Block>> blocks_;
  torch::Tensor input_;
  std::vector<torch::Tensor> outputs_;  // per block, with graph
  std::vector<torch::Tensor> grads_;    // per block output, after B
};

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_SPLIT_PASS_H_
