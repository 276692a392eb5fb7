// A block is the unit of partitioning: a model is an ordered list of blocks and
// a stage is any contiguous range of them.
#ifndef STAGEWISE_SERVICES_MODELS_BLOCK_H_
#define STAGEWISE_SERVICES_MODELS_BLOCK_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stagewise::models {

// What a block is, known before any tensor exists (the planner and the
// partitioner read this without building the model).
struct BlockInfo {
  int index = 0;     // global position in the model
  std::string kind;  // stem | linear | residual | downsample | reversible | head
  bool reversible = false;
  std::vector<int64_t> in_shape;  // per sample, without the batch dimension
  std::vector<int64_t> out_shape;
  // Constructor arguments.
  int64_t in_channels = 0;
  int64_t out_channels = 0;  // reversible: channels of one stream
  int64_t mid_channels = 0;  // bottleneck width
  int64_t stride = 1;
  bool bottleneck = false;
  bool imagenet_stem = false;  // 7x7/2 conv + 3x3/2 max-pool
  bool flatten = false;        // linear blocks: flatten the input first
  bool relu = true;            // linear blocks: ReLU after the layer
  bool pair = false;           // downsample on a reversible pair (RevNet)
};

class Block : public torch::nn::Module {
 public:
  explicit Block(BlockInfo info) : info_(std::move(info)) {}
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // Rebuilds the input from the output. Only reversible blocks implement it.
  virtual torch::Tensor inverse(const torch::Tensor& y);
  bool reversible() const { return info_.reversible; }
  const BlockInfo& info() const { return info_; }
  int64_t num_parameters() const;

 private:
  BlockInfo info_;
};

// Builds one block from its description. Initialisation draws from the
// current torch generator; the zoo seeds it per global block index.
std::shared_ptr<Block> MakeBlock(const BlockInfo& info);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_BLOCK_H_
