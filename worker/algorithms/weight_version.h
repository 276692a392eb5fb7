// A frozen version of a stage's parameters for a forward whose graph is kept
// until its gradient returns, several optimizer steps later (`delayed` with
// `forward: once`: weight stashing as PipeDream runs it, one forward per
// mini-batch instead of a graph-free forward and a recomputation).
//
// A graph saves the parameters it used by reference (the leaf tensor itself,
// and views of it such as a Linear's transposed weight). Steps in between
// change those tensors in place, which autograd detects (a version mismatch)
// and which would anyway give gradients at the current weights, not the
// forward's. So the forward and its backward each run while the version is
// in use (InUse): every parameter points at the version's own copy
// (Tensor::set_data: the same tensor object, other storage) and carries the
// version's own version counter. The optimizer's in-place steps in between
// touch neither. The graph then holds exactly the stash, and no second copy
// is made for the backward.
//
// Threading: the compute thread (as the model).
#ifndef STAGEWISE_WORKER_ALGORITHMS_WEIGHT_VERSION_H_
#define STAGEWISE_WORKER_ALGORITHMS_WEIGHT_VERSION_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace stagewise::worker {

class WeightVersion {
 public:
  WeightVersion() = default;
  // A copy of `params`' current values (detached, not requiring grad).
  static WeightVersion Take(const std::vector<torch::Tensor>& params);

  // While alive, each of `params` (the same list Take copied) holds this
  // version's values and version counter; then its own storage and counter
  // come back. They do not nest.
  class InUse {
   public:
    InUse(WeightVersion& version, std::vector<torch::Tensor>& params);
    ~InUse();
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;

   private:
    std::vector<torch::Tensor>& params_;
    std::vector<torch::Tensor> live_;  // the parameters' own storage
    std::vector<c10::VariableVersion> counters_;
  };

  const std::vector<torch::Tensor>& values() const { return values_; }
  int64_t bytes() const;

 private:
  std::vector<torch::Tensor> values_;
  std::vector<c10::VariableVersion> counters_;  // fresh, one per parameter
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_WEIGHT_VERSION_H_
