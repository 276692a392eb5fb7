// What a block is, known before any tensor exists. No LibTorch: the
// coordinator and the planner read block descriptions without building them.
#ifndef STAGEWISE_SERVICES_MODELS_BLOCK_INFO_H_
#define STAGEWISE_SERVICES_MODELS_BLOCK_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace stagewise::models {

// What a block is, known before any tensor exists (the planner and the
// partitioner read this without building the model).
struct BlockInfo {
  int index = 0;  // global position in the model
  // stem | linear | residual | downsample | reversible | head | emulated | script,
  // and the text models' embedding | transformer | rev_transformer | lm_head
  // (their shapes are per sample [T] or [T, width], T the sequence length);
  // bottleneck_down | bottleneck_up at the cuts (stages.bottleneck).
  std::string kind;
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
  bool pair = false;           // downsample on a reversible pair (RevNet); embedding: two streams
  int64_t heads = 0;           // attention heads (transformer blocks)
  // emulated blocks: how long the forward and the backward wait, in seconds
  // per sample (a micro-batch of n samples waits n times this).
  double forward_seconds_per_sample = 0;
  double backward_seconds_per_sample = 0;
  // script blocks (TorchScript): trainable parameters, counted by the dry run.
  int64_t parameters = 0;
  // emulated blocks: the share of the backward's wait that is weight
  // gradients (a weight-only pass waits this share, an input-only pass the rest).
  double backward_weight_share = 0.5;
  // bottleneck_down / bottleneck_up (stages.bottleneck): the seed of the
  // orthonormal basis both halves of a cut start from (the up-projection
  // is the down-projection's transpose, so together they start as a
  // projection onto `rank` channels).
  uint64_t basis_seed = 0;
};

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_BLOCK_INFO_H_
