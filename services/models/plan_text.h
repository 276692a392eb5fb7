// The text models' descriptions (gpt, reformer; docs/text.md), for plan.cc.
// Internal to services/models/.
#ifndef STAGEWISE_SERVICES_MODELS_PLAN_TEXT_H_
#define STAGEWISE_SERVICES_MODELS_PLAN_TEXT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "services/models/block_info.h"
#include "services/spec/job_spec.h"

namespace stagewise::models {

// Whether `kind` is one of the text models' blocks.
bool IsTextBlock(const BlockInfo& b);

// gpt: embedding, depth Transformer blocks, LM head. reformer: a two-stream
// embedding, depth reversible blocks, LM head. spec.input_shape is
// [sequence_length], spec.num_classes the 256 byte values.
absl::StatusOr<std::vector<BlockInfo>> PlanTextModel(const ModelSpec& spec);

// Trainable parameters of a text block (exact: the modules' count).
double TextBlockParameters(const BlockInfo& b);

// Per-sample forward + backward MACs of a text block (its linear layers and
// the attention's two T x T products); the caller adds the memory-bound
// charges of EstimateBlockWork from `layer_outputs`, the values its layers
// write per sample.
double TextBlockMacs(const BlockInfo& b, double* layer_outputs);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_PLAN_TEXT_H_
