#include "services/models/modal_pass.h"

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/spec/enums.h"

namespace stagewise::models {

std::pair<torch::Tensor, torch::Tensor> RebuildBackward(ReversibleBlock& block,
                                                        const torch::Tensor& y,
                                                        const torch::Tensor& dy, bool input_grad) {
  return block.RebuildBackward(y, dy, input_grad);
}

absl::StatusOr<ModalPass> ModalPass::Forward(const std::vector<std::shared_ptr<Block>>& blocks,
                                             const std::vector<BlockMode>& modes,
                                             const torch::Tensor& x, bool input_grad) {
  if (!modes.empty() && modes.size() != blocks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block modes: ", modes.size(), " given for ", blocks.size(), " blocks"));
  }
  ModalPass pass;
  pass.blocks_ = blocks;
  pass.input_grad_ = input_grad;
  auto mode = [&](size_t i) { return modes.empty() ? BlockMode::kStore : modes[i]; };
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (mode(i) == BlockMode::kRebuild && !blocks[i]->reversible()) {
      return absl::InvalidArgumentError(absl::StrCat("block ", blocks[i]->info().index, " (",
                                                     blocks[i]->info().kind,
                                                     ") is not reversible: it can only store"));
    }
  }
  torch::Tensor h = x;
  for (size_t i = 0; i < blocks.size();) {
    Segment s;
    s.begin = static_cast<int>(i);
    s.store = mode(i) == BlockMode::kStore;
    while (i < blocks.size() && (mode(i) == BlockMode::kStore) == s.store) ++i;
    s.end = static_cast<int>(i);
    if (s.store) {
      const bool leaf_grad = s.begin > 0 || input_grad;
      s.input = leaf_grad ? h.detach().requires_grad_(true) : h.detach();
      torch::Tensor out = s.input;
      for (int b = s.begin; b < s.end; ++b) out = blocks[b]->forward(out);
      s.output = out;
      h = out.detach();
    } else {
      torch::NoGradGuard no_grad;
      for (int b = s.begin; b < s.end; ++b) h = blocks[b]->forward(h);
    }
    pass.segments_.push_back(std::move(s));
  }
  pass.output_ = h;
  return pass;
}

torch::Tensor ModalPass::Backward(const torch::Tensor& grad_output) {
  torch::Tensor y = output_, g = grad_output;
  output_ = torch::Tensor();
  for (int s = static_cast<int>(segments_.size()) - 1; s >= 0; --s) {
    Segment& seg = segments_[s];
    const bool want_grad = s > 0 || input_grad_;
    if (seg.store) {
      seg.output.backward(g);
      g = want_grad ? seg.input.grad() : torch::Tensor();
      y = seg.input.detach();
    } else {
      // The forward already moved the running statistics.
      FreezeRunningStats freeze;
      for (int b = seg.end - 1; b >= seg.begin; --b) {
        auto* block = static_cast<ReversibleBlock*>(blocks_[b].get());
        auto [x, dx] = RebuildBackward(*block, y, g, want_grad || b > seg.begin);
        y = x;
        g = dx;
      }
    }
    seg = Segment{};
  }
  segments_.clear();
  return input_grad_ ? g : torch::Tensor();
}

}  // namespace stagewise::models
