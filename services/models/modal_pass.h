// Forward and backward through a run of blocks where each reversible block
// runs in one of the two modes of Jiang et al.'s reversible training
// framework (Table 1; docs/references.md, docs/planner.md), as the planner chose:
//  - store (compute-centric, "C-Mode"): the block keeps its autograd graph
//    (its activations) from the forward to the backward;
//  - rebuild (memory-centric, "M-Mode"): the forward runs without a graph and
//    keeps nothing; the backward rebuilds the block's input from its output
//    (x = y~, x~ = y - F(x)) while keeping the graph of F, and takes the
//    vector-Jacobian product in the same pass.
// Non-reversible blocks always store. Consecutive storing blocks share one
// graph segment. The backward gives the exact gradient (up to rounding of the
// rebuilt inputs); BatchNorm running statistics move once, in the forward.
#ifndef STAGEWISE_SERVICES_MODELS_MODAL_PASS_H_
#define STAGEWISE_SERVICES_MODELS_MODAL_PASS_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/models/block.h"
#include "services/models/blocks.h"
#include "services/spec/enums.h"

namespace stagewise::models {

using BlockMode = ::stagewise::BlockMode;  // services/spec/enums.h

// One reversible block backwards in rebuild mode: from its output y and the
// gradient dy, the rebuilt input x and dx (undefined unless `input_grad`).
// Parameter gradients accumulate in .grad. F runs once, with a graph; callers
// decide whether BatchNorm running statistics may move (FreezeRunningStats).
std::pair<torch::Tensor, torch::Tensor> RebuildBackward(ReversibleBlock& block,
                                                        const torch::Tensor& y,
                                                        const torch::Tensor& dy, bool input_grad);

class ModalPass {
 public:
  // Runs `blocks` on x. `modes` has one entry per block (kRebuild only on
  // reversible blocks), or is empty (every block stores). With `input_grad`
  // the backward returns the gradient of x.
  static absl::StatusOr<ModalPass> Forward(const std::vector<std::shared_ptr<Block>>& blocks,
                                           const std::vector<BlockMode>& modes,
                                           const torch::Tensor& x, bool input_grad);

  // The output, without a graph (what the next stage or the loss sees).
  const torch::Tensor& output() const { return output_; }

  // From the gradient of the output: parameter gradients accumulate and the
  // gradient of x comes back (undefined without input_grad). Once only.
  torch::Tensor Backward(const torch::Tensor& grad_output);

 private:
  struct Segment {
    int begin = 0, end = 0;  // block indices [begin, end)
    bool store = true;
    torch::Tensor
        input;  // store: the segment's leaf (requires grad unless first and no input_grad)
    torch::Tensor output;  // store: the segment's output, with graph
  };
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<Segment> segments_;
  torch::Tensor output_;
  bool input_grad_ = false;
};

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_MODAL_PASS_H_
