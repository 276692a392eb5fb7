// A model (or one stage of it): an ordered run of blocks [begin, end).
#ifndef STAGEWISE_SERVICES_MODELS_MODEL_H_
#define STAGEWISE_SERVICES_MODELS_MODEL_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/models/block.h"
#include "services/models/plan.h"
#include "services/spec/job_spec.h"

namespace stagewise::models {

class Model : public torch::nn::Module {
 public:
  // `blocks` must be contiguous in global index. Submodules are named by the
  // global block index, so parameter names agree across partitions
  // ("7.body.layers.0.weight" is the same tensor whichever stage holds block 7).
  explicit Model(std::vector<std::shared_ptr<Block>> blocks);

  torch::Tensor forward(const torch::Tensor& x);
  int begin() const { return begin_; }
  int end() const { return end_; }
  int size() const { return static_cast<int>(blocks_.size()); }
  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }
  // Blocks [begin, end) (global indices) of this model, sharing parameters.
  std::shared_ptr<Model> Slice(int begin, int end) const;
  int64_t num_parameters() const;

 private:
  std::vector<std::shared_ptr<Block>> blocks_;
  int begin_ = 0;
  int end_ = 0;
};

// Runs `build` with the global torch generator seeded to `seed`, under the
// lock every model build takes (parameter init draws from that generator).
void WithInitSeed(uint64_t seed, const std::function<void()>& build);

// Builds blocks [begin, end) (end < 0: to the last block). Each block is
// initialised from BlockSeed(seed, index), so any partition of the same spec
// and seed holds exactly the weights of the whole model.
absl::StatusOr<std::shared_ptr<Model>> BuildModel(const ModelSpec& spec, uint64_t seed,
                                                  int begin = 0, int end = -1);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_MODEL_H_
