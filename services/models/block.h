// A block is the unit of partitioning: a model is an ordered list of blocks and
// a stage is any contiguous range of them.
#ifndef STAGEWISE_SERVICES_MODELS_BLOCK_H_
#define STAGEWISE_SERVICES_MODELS_BLOCK_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>

#include "services/models/block_info.h"

namespace stagewise::models {

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
