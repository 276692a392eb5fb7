#include "services/models/plan_text.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stagewise::models {
namespace {

constexpr int64_t kDefaultTextWidth = 128;
// The MLP's hidden width, in multiples of the model width (GPT-2's).
constexpr int64_t kMlpRatio = 4;

}  // namespace

bool IsTextBlock(const BlockInfo& b) {
  return b.kind == "embedding" || b.kind == "transformer" || b.kind == "rev_transformer" ||
         b.kind == "lm_head";
}

absl::StatusOr<std::vector<BlockInfo>> PlanTextModel(const ModelSpec& spec) {
  if (spec.input_shape.size() != 1 || spec.input_shape[0] < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.name: ", NameOf(spec.name),
                     " reads byte sequences [T] (data.dataset fortunes or text_file)"));
  }
  const int64_t t = spec.input_shape[0];
  const int64_t width = spec.width > 0 ? spec.width : kDefaultTextWidth;
  if (spec.heads < 1 || width % spec.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.heads: ", spec.heads, " heads do not divide model.width ", width));
  }
  const bool reversible = spec.name == ModelKind::kReformer;
  const int64_t streams = reversible ? 2 : 1;
  std::vector<BlockInfo> blocks;
  auto add = [&](BlockInfo b, std::vector<int64_t> in, std::vector<int64_t> out) {
    b.index = static_cast<int>(blocks.size());
    b.in_shape = std::move(in);
    b.out_shape = std::move(out);
    blocks.push_back(std::move(b));
  };
  BlockInfo embedding;
  embedding.kind = "embedding";
  embedding.in_channels = spec.num_classes;
  embedding.out_channels = width;
  embedding.pair = reversible;
  add(embedding, {t}, {t, streams * width});
  for (int i = 0; i < spec.depth; ++i) {
    BlockInfo b;
    b.kind = reversible ? "rev_transformer" : "transformer";
    b.reversible = reversible;
    b.in_channels = streams * width;
    b.out_channels = width;
    b.mid_channels = kMlpRatio * width;
    b.heads = spec.heads;
    add(b, {t, streams * width}, {t, streams * width});
  }
  BlockInfo head;
  head.kind = "lm_head";
  head.in_channels = streams * width;
  head.out_channels = spec.num_classes;
  add(head, {t, streams * width}, {t, spec.num_classes});
  return blocks;
}

double TextBlockParameters(const BlockInfo& b) {
  const double in = static_cast<double>(b.in_channels);
  const double out = static_cast<double>(b.out_channels);
  if (b.kind == "embedding") return (in + static_cast<double>(b.in_shape.at(0))) * out;
  if (b.kind == "lm_head") return 2 * in + in * out + out;
  // Two LayerNorms, qkv and projection, the MLP's two layers.
  const double w = out, hidden = static_cast<double>(b.mid_channels);
  return 4 * w + (3 * w * w + 3 * w) + (w * w + w) + (w * hidden + hidden) + (hidden * w + w);
}

double TextBlockMacs(const BlockInfo& b, double* layer_outputs) {
  const double t = static_cast<double>(b.in_shape.at(0));
  const double in = static_cast<double>(b.in_channels);
  const double out = static_cast<double>(b.out_channels);
  // A backward costs about twice its forward.
  constexpr double kForwardAndBackward = 3;
  if (b.kind == "embedding") {
    *layer_outputs = t * in;
    return kForwardAndBackward * t * out;
  }
  if (b.kind == "lm_head") {
    *layer_outputs = t * out;
    return kForwardAndBackward * t * in * out;
  }
  const double w = out, hidden = static_cast<double>(b.mid_channels);
  // qkv, projection, MLP; scores and their weighted sum; the T x T scores
  // of every head are written, normalised and kept.
  *layer_outputs = t * (3 * w + w + hidden + w) + 2 * t * t * static_cast<double>(b.heads);
  return kForwardAndBackward * (t * (3 * w * w + w * w + 2 * w * hidden) + 2 * t * t * w);
}

}  // namespace stagewise::models
