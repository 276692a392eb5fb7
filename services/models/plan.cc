// The model zoo's descriptions: every block of MLP, ResNet (CIFAR and
// ImageNet style) and RevNet (PETRA) with its shapes, and stage partitions.
// No LibTorch: the coordinator and the planner read this without building.
#include "services/models/plan.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/common/status_macros.h"
#include "services/models/plan_text.h"
#include "services/planner/partition.h"

namespace stagewise::models {
namespace {

int64_t Down(int64_t size) { return (size + 1) / 2; }  // 3x3/2 pad 1, 1x1/2, 7x7/2 pad 3

// Builder that appends blocks while tracking the per-sample shape.
class Planner {
 public:
  explicit Planner(std::vector<int64_t> input) : shape_(std::move(input)) {}

  void Add(BlockInfo info, std::vector<int64_t> out) {
    info.index = static_cast<int>(blocks_.size());
    info.in_shape = shape_;
    info.out_shape = out;
    shape_ = std::move(out);
    blocks_.push_back(std::move(info));
  }
  const std::vector<int64_t>& shape() const { return shape_; }
  std::vector<BlockInfo> Take() { return std::move(blocks_); }

  // Image stem: [C,H,W] -> [out,H',W'].
  void Stem(int64_t out, bool small_input) {
    BlockInfo b;
    b.kind = "stem";
    b.in_channels = shape_[0];
    b.out_channels = out;
    b.imagenet_stem = !small_input;
    b.stride = small_input ? 1 : 2;
    int64_t h = shape_[1], w = shape_[2];
    if (!small_input) {
      h = Down(Down(h));
      w = Down(Down(w));
    }
    Add(b, {out, h, w});
  }

  void Residual(int64_t out, int64_t mid, int64_t stride, bool bottleneck) {
    BlockInfo b;
    b.kind = stride > 1 ? "downsample" : "residual";
    b.in_channels = shape_[0];
    b.out_channels = out;
    b.mid_channels = mid;
    b.stride = stride;
    b.bottleneck = bottleneck;
    int64_t h = stride > 1 ? Down(shape_[1]) : shape_[1];
    int64_t w = stride > 1 ? Down(shape_[2]) : shape_[2];
    Add(b, {out, h, w});
  }

  // RevNet downsampling: [2*S_in, H, W] -> [2*S_out, H/2, W/2] on the pair.
  void PairDownsample(int64_t stream_out, int64_t mid, bool bottleneck) {
    Residual(2 * stream_out, mid, 2, bottleneck);
    blocks_.back().pair = true;
  }

  void Reversible(int64_t mid, bool bottleneck) {
    BlockInfo b;
    b.kind = "reversible";
    b.reversible = true;
    b.in_channels = shape_[0];
    b.out_channels = shape_[0] / 2;  // one stream
    b.mid_channels = mid;
    b.bottleneck = bottleneck;
    Add(b, shape_);
  }

  void Head(int64_t classes) {
    BlockInfo b;
    b.kind = "head";
    b.in_channels = shape_[0];
    if (shape_.size() != 3) {
      b.in_channels = 1;
      for (int64_t d : shape_) b.in_channels *= d;
    }
    b.out_channels = classes;
    Add(b, {classes});
  }

 private:
  std::vector<int64_t> shape_;
  std::vector<BlockInfo> blocks_;
};

absl::StatusOr<std::vector<int>> StageBlocks(const ModelSpec& spec, size_t groups,
                                             const std::vector<int>& from_depth) {
  if (spec.blocks.empty()) return from_depth;
  if (spec.blocks.size() != groups) {
    return absl::InvalidArgumentError(absl::StrCat("model.blocks: ", spec.name, " needs ", groups,
                                                   " entries, got ", spec.blocks.size()));
  }
  for (int n : spec.blocks) {
    if (n < 1) return absl::InvalidArgumentError("model.blocks: every entry must be >= 1");
  }
  return spec.blocks;
}

// Blocks per group of the four-group (ImageNet-style) networks: depth 18 and 34
// use basic blocks, 50 bottlenecks (He et al. 2016, Tab. 1); `blocks` overrides.
struct Layout {
  std::vector<int> blocks;
  bool bottleneck = false;
};

absl::StatusOr<Layout> FourGroupLayout(const ModelSpec& spec, const std::string& family) {
  Layout layout;
  std::vector<int> from_depth;
  if (spec.depth == 18) {
    from_depth = {2, 2, 2, 2};
  } else if (spec.depth == 34 || spec.depth == 50) {
    from_depth = {3, 4, 6, 3};
    layout.bottleneck = spec.depth == 50;
  } else if (spec.blocks.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.depth: ", family, " depth must be 18, 34 or 50, got ", spec.depth));
  }
  auto blocks = StageBlocks(spec, 4, from_depth);
  if (!blocks.ok()) return blocks.status();
  layout.blocks = *blocks;
  return layout;
}

absl::StatusOr<std::vector<BlockInfo>> PlanMlp(const ModelSpec& spec) {
  Planner p(spec.input_shape);
  int64_t features = 1;
  for (int64_t d : spec.input_shape) features *= d;
  bool first = true;
  for (int h : spec.hidden) {
    BlockInfo b;
    b.kind = "linear";
    b.in_channels = features;
    b.out_channels = h;
    b.flatten = first;
    first = false;
    p.Add(b, {h});
    features = h;
  }
  p.Head(spec.num_classes);
  return p.Take();
}

absl::StatusOr<std::vector<BlockInfo>> PlanResNet(const ModelSpec& spec) {
  Planner p(spec.input_shape);
  if (spec.style == ResNetStyle::kCifar) {
    // He et al. 2016, Sec. 4.2: 3 groups of n basic blocks, widths w, 2w, 4w.
    std::vector<int> from_depth;
    if (spec.blocks.empty()) {
      if (spec.depth < 8 || (spec.depth - 2) % 6 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.depth: CIFAR ResNet depth must be 6n+2 (20, 32, 56, 110), got ", spec.depth));
      }
      from_depth.assign(3, (spec.depth - 2) / 6);
    }
    auto blocks = StageBlocks(spec, 3, from_depth);
    if (!blocks.ok()) return blocks.status();
    const int64_t w = spec.width > 0 ? spec.width : 16;
    p.Stem(w, /*small_input=*/true);
    for (int g = 0; g < 3; ++g) {
      for (int i = 0; i < (*blocks)[g]; ++i) {
        p.Residual(w << g, w << g, (g > 0 && i == 0) ? 2 : 1, false);
      }
    }
    p.Head(spec.num_classes);
    return p.Take();
  }
  auto layout = FourGroupLayout(spec, "ImageNet ResNet");
  if (!layout.ok()) return layout.status();
  const std::vector<int>& blocks = layout->blocks;
  const bool bottleneck = layout->bottleneck;
  const int64_t w = spec.width > 0 ? spec.width : 64;
  const int64_t expansion = bottleneck ? 4 : 1;
  p.Stem(w, spec.small_input);
  for (int g = 0; g < 4; ++g) {
    for (int i = 0; i < blocks[g]; ++i) {
      p.Residual((w << g) * expansion, w << g, (g > 0 && i == 0) ? 2 : 1, bottleneck);
    }
  }
  p.Head(spec.num_classes);
  return p.Take();
}

// RevNet as in PETRA Sec. 4.1: the ResNet layout with every block that keeps
// its shape made reversible; each stream has the ResNet's channel count, so the
// activation has twice as many. Stem, downsampling blocks and head are not
// reversible.
absl::StatusOr<std::vector<BlockInfo>> PlanRevNet(const ModelSpec& spec) {
  Planner p(spec.input_shape);
  auto layout = FourGroupLayout(spec, "RevNet");
  if (!layout.ok()) return layout.status();
  const std::vector<int>& blocks = layout->blocks;
  const bool bottleneck = layout->bottleneck;
  const int64_t w = spec.width > 0 ? spec.width : 64;
  const int64_t expansion = bottleneck ? 4 : 1;
  p.Stem(2 * w * expansion, spec.small_input);
  for (int g = 0; g < 4; ++g) {
    const int64_t stream = (w << g) * expansion;
    for (int i = 0; i < blocks[g]; ++i) {
      if (g > 0 && i == 0) {
        p.PairDownsample(stream, w << g, bottleneck);
      } else {
        p.Reversible(w << g, bottleneck);
      }
    }
  }
  p.Head(spec.num_classes);
  return p.Take();
}

// Emulated accelerators (docs/models.md): `depth` blocks that keep the shape
// and wait a configured time instead of computing, then a head. Reversible
// blocks couple two halves of the channels, so the channel count must be even.
absl::StatusOr<std::vector<BlockInfo>> PlanEmulated(const ModelSpec& spec) {
  if (spec.batch_size < 1) {
    return absl::InvalidArgumentError(
        "model: emulated blocks need the job's batch_size (their times are per mini-batch)");
  }
  if (spec.reversible && spec.input_shape[0] % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.reversible: reversible emulated blocks split the channels in two; data.shape[0] "
        "must be even, got ",
        spec.input_shape[0]));
  }
  for (const auto* list : {&spec.block_forward_ms, &spec.block_backward_ms}) {
    if (!list->empty() && static_cast<int>(list->size()) != spec.depth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.block_", list == &spec.block_forward_ms ? "forward" : "backward",
          "_ms: needs one entry per block (model.depth ", spec.depth, "), got ", list->size()));
    }
  }
  Planner p(spec.input_shape);
  const double batch = static_cast<double>(spec.batch_size);
  for (int i = 0; i < spec.depth; ++i) {
    BlockInfo b;
    b.kind = "emulated";
    b.reversible = spec.reversible;
    b.in_channels = spec.input_shape[0];
    b.out_channels = spec.reversible ? spec.input_shape[0] / 2 : spec.input_shape[0];
    const double forward_ms =
        spec.block_forward_ms.empty() ? spec.forward_ms : spec.block_forward_ms[i];
    const double backward_ms =
        spec.block_backward_ms.empty() ? spec.backward_ms : spec.block_backward_ms[i];
    b.forward_seconds_per_sample = forward_ms / 1e3 / batch;
    b.backward_seconds_per_sample = backward_ms / 1e3 / batch;
    b.backward_weight_share = spec.backward_weight_share;
    p.Add(b, spec.input_shape);
  }
  p.Head(spec.num_classes);
  return p.Take();
}

}  // namespace

namespace {

// Bounds on what a job may describe (docs/security.md): far beyond what one
// stage can train, small enough that the arithmetic and the refusals are cheap.
constexpr double kMaxModelParameters = 1e10;
constexpr double kMaxActivationElements = 1 << 30;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// A TorchScript model's blocks, as the CLI's dry run found them (the
// `script_model` section); the file itself is only read where LibTorch is.
absl::StatusOr<std::vector<BlockInfo>> PlanScript(const ModelSpec& spec) {
  if (spec.script_blocks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model: the blocks of the torchscript model '", spec.path,
        "' are not known yet: give the job to the stagewise CLI (validate, train-local, local, "
        "submit), which loads the file, dry-runs it and adds a script_model section"));
  }
  std::vector<BlockInfo> blocks;
  for (size_t i = 0; i < spec.script_blocks.size(); ++i) {
    const ModelSpec::ScriptBlock& s = spec.script_blocks[i];
    const std::string where = absl::StrCat("script_model.blocks[", i, "]");
    if (i == 0 && !spec.input_shape.empty() && s.in_shape != spec.input_shape) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".in: block 0 takes ",
                                                     ShapeText(s.in_shape), " but the data has ",
                                                     ShapeText(spec.input_shape)));
    }
    if (i > 0 && s.in_shape != blocks.back().out_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".in: block ", i, " takes ", ShapeText(s.in_shape), " but block ",
                       i - 1, " outputs ", ShapeText(blocks.back().out_shape)));
    }
    BlockInfo b;
    b.index = static_cast<int>(i);
    b.kind = "script";
    b.reversible = s.reversible;
    b.in_shape = s.in_shape;
    b.out_shape = s.out_shape;
    b.in_channels = s.in_shape.front();
    b.out_channels = s.out_shape.front();
    b.parameters = s.parameters;
    blocks.push_back(std::move(b));
  }
  const std::vector<int64_t> classes = {spec.num_classes};
  if (blocks.back().out_shape != classes) {
    return absl::InvalidArgumentError(
        absl::StrCat("script_model.blocks[", blocks.size() - 1, "].out: the last block outputs ",
                     ShapeText(blocks.back().out_shape), "; it must output one logit per class, ",
                     ShapeText(classes)));
  }
  return blocks;
}

absl::StatusOr<std::vector<BlockInfo>> PlanBlocks(const ModelSpec& spec) {
  if (spec.num_classes < 1) {
    return absl::InvalidArgumentError("model: number of classes unknown (data section missing?)");
  }
  if (spec.name == ModelKind::kTorchScript) return PlanScript(spec);
  if (IsTextModel(spec.name)) return PlanTextModel(spec);
  if (spec.name == ModelKind::kMlp) {
    if (spec.input_shape.empty()) return absl::InvalidArgumentError("model: input shape unknown");
    return PlanMlp(spec);
  }
  if (spec.input_shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.name: ", NameOf(spec.name), " needs image input [C, H, W], got rank ",
                     spec.input_shape.size(), " (text data takes gpt or reformer)"));
  }
  switch (spec.name) {
    case ModelKind::kResNet:
      return PlanResNet(spec);
    case ModelKind::kRevNet:
      return PlanRevNet(spec);
    case ModelKind::kEmulated:
      return PlanEmulated(spec);
    case ModelKind::kMlp:
    case ModelKind::kTorchScript:
    case ModelKind::kGpt:
    case ModelKind::kReformer:
      break;
  }
  return absl::InternalError(absl::StrCat("model.name ", NameOf(spec.name), ": no planner"));
}

}  // namespace

bool IsBottleneckBlock(const BlockInfo& b) {
  return b.kind == "bottleneck_down" || b.kind == "bottleneck_up";
}

double EstimateParameters(const BlockInfo& b) {
  const double in = static_cast<double>(b.in_channels);
  const double out = static_cast<double>(b.out_channels);
  const double mid = static_cast<double>(b.mid_channels);
  if (b.kind == "script") return static_cast<double>(b.parameters);
  if (IsBottleneckBlock(b)) return in * out + out;
  if (IsTextBlock(b)) return TextBlockParameters(b);
  if (b.kind == "linear" || b.kind == "head") return in * out + out;
  if (b.kind == "stem") return (b.imagenet_stem ? 49 : 9) * in * out + 2 * out;
  if (b.kind == "emulated") {
    // A scale and a shift per value of the (half) activation.
    double values = 2 * out;
    for (size_t d = 1; d < b.in_shape.size(); ++d) values *= static_cast<double>(b.in_shape[d]);
    return values;
  }
  if (b.kind == "reversible") {
    // F and G, each a residual function on one stream.
    const double one = b.bottleneck ? out * mid + 9 * mid * mid + mid * out : 18 * out * out;
    return 2 * one + 8 * out;
  }
  // residual / downsample, with a projection shortcut when the shape changes.
  const double body =
      b.bottleneck ? in * mid + 9 * mid * mid + mid * out : 9 * in * out + 9 * out * out;
  const double shortcut = (b.stride > 1 || b.in_channels != b.out_channels) ? in * out : 0;
  return body + shortcut + 6 * out;
}

namespace {

// The dimension of a per-sample shape that holds channels: [C, H, W] -> 0,
// [T, width] -> 1, [width] -> 0.
size_t ChannelDim(const std::vector<int64_t>& shape) { return shape.size() == 2 ? 1 : 0; }

// ModelSpec::bottleneck: the model's own blocks cut by the partition it
// names, with a bottleneck_down after the last block of every stage but the
// last and a bottleneck_up before the first block of the next.
absl::StatusOr<std::vector<BlockInfo>> InsertBottlenecks(const ModelSpec& spec,
                                                         std::vector<BlockInfo> base) {
  const ModelSpec::Bottleneck& bn = spec.bottleneck;
  StagesSpec stages;
  stages.count = bn.stages;
  stages.partition = bn.partition;
  stages.ranges = bn.ranges;
  STAGEWISE_ASSIGN_OR_RETURN(const auto ranges, ResolvePartition(stages, base));
  std::vector<BlockInfo> out;
  for (size_t j = 0; j < ranges.size(); ++j) {
    for (int i = ranges[j].first; i < ranges[j].second; ++i) out.push_back(base[i]);
    if (j + 1 == ranges.size()) break;
    const BlockInfo& last = base[ranges[j].second - 1];
    if (last.out_shape.empty() || last.out_shape.size() > 3) {
      return absl::InvalidArgumentError(absl::StrCat("stages.bottleneck: cut ", j, " (after block ",
                                                     last.index, ", ", last.kind,
                                                     ") has no channels to project"));
    }
    const size_t c = ChannelDim(last.out_shape);
    const int64_t channels = last.out_shape[c];
    if (bn.rank >= channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stages.bottleneck.rank: ", bn.rank, " is not below the ", channels,
          " channels that cross cut ", j, " (after block ", last.index, ", ", last.kind, ")"));
    }
    BlockInfo down;
    down.kind = "bottleneck_down";
    down.in_shape = down.out_shape = last.out_shape;
    down.out_shape[c] = bn.rank;
    down.in_channels = channels;
    down.out_channels = bn.rank;
    // The basis depends on the cut and the sizes only, so both halves draw it.
    down.basis_seed = BlockSeed(static_cast<uint64_t>(channels) * 65537 + bn.rank, j);
    BlockInfo up = down;
    up.kind = "bottleneck_up";
    std::swap(up.in_shape, up.out_shape);
    std::swap(up.in_channels, up.out_channels);
    out.push_back(std::move(down));
    out.push_back(std::move(up));
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].index = static_cast<int>(i);
  return out;
}

}  // namespace

absl::StatusOr<std::vector<BlockInfo>> PlanModel(const ModelSpec& spec) {
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<BlockInfo> blocks, PlanBlocks(spec));
  if (spec.bottleneck.rank > 0) {
    STAGEWISE_ASSIGN_OR_RETURN(blocks, InsertBottlenecks(spec, std::move(blocks)));
  }
  // Refuse what no stage could hold, before anything is allocated.
  double parameters = 0;
  for (const BlockInfo& b : blocks) {
    parameters += EstimateParameters(b);
    double elements = 1;
    for (int64_t d : b.out_shape) elements *= static_cast<double>(d);
    if (elements > kMaxActivationElements) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model: block %d (%s) outputs %.3g values per sample; at most %.3g are supported",
          b.index, b.kind, elements, kMaxActivationElements));
    }
  }
  if (parameters > kMaxModelParameters) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model: about %.3g parameters; at most %.3g are supported (check "
                        "model.hidden / model.width)",
                        parameters, kMaxModelParameters));
  }
  return blocks;
}

uint64_t BlockSeed(uint64_t job_seed, int index) {
  // splitmix64 of the pair, so neighbouring indices get unrelated streams.
  uint64_t z = job_seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(index) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFULL;
}

namespace {

// The memory-bound charges of EstimateBlockWork, in MACs per value: for every
// value a convolution or linear layer writes (then normalised, rectified and
// kept for the backward) and for every value the block reads or writes
// (chunk, cat, residual additions). A least-squares fit of fwd + bwd times of
// the ten quickstart blocks (LibTorch 1.13, one thread, batch 128) gave 82 and
// 45 MACs per value, and about 50 ps per MAC for the whole.
constexpr double kWorkPerLayerOutput = 80;
constexpr double kWorkPerBlockValue = 45;
constexpr double kSecondsPerWork = 50e-12;

double Volume(const std::vector<int64_t>& shape) {
  double v = 1;
  for (int64_t d : shape) v *= static_cast<double>(d);
  return v;
}

// A k x k convolution writing `out` channels over `pixels` output positions.
double ConvWork(double in, double out, double k, double pixels) {
  return pixels * in * out * k * k + kWorkPerLayerOutput * pixels * out;
}

// The body of a residual function (ResidualBody): in -> out at `pixels`
// output positions; the first (or, for bottlenecks, the middle) convolution
// strides, so it reads `in_pixels`.
double BodyWork(double in, double mid, double out, bool bottleneck, double in_pixels,
                double pixels) {
  if (bottleneck) {
    return ConvWork(in, mid, 1, in_pixels) + ConvWork(mid, mid, 3, pixels) +
           ConvWork(mid, out, 1, pixels);
  }
  return ConvWork(in, out, 3, pixels) + ConvWork(out, out, 3, pixels);
}

double Pixels(const std::vector<int64_t>& shape) {
  return shape.size() == 3 ? static_cast<double>(shape[1] * shape[2]) : 1;
}

}  // namespace

double EstimateBlockWork(const BlockInfo& b) {
  if (b.kind == "emulated") {
    return (b.forward_seconds_per_sample + b.backward_seconds_per_sample) / kSecondsPerWork;
  }
  const double in = static_cast<double>(b.in_channels);
  const double out = static_cast<double>(b.out_channels);
  const double mid = static_cast<double>(b.mid_channels);
  const double in_pixels = Pixels(b.in_shape), pixels = Pixels(b.out_shape);
  const double io = kWorkPerBlockValue * (Volume(b.in_shape) + Volume(b.out_shape));
  if (IsTextBlock(b)) {
    double layer_outputs = 0;
    const double macs = TextBlockMacs(b, &layer_outputs);
    return macs + kWorkPerLayerOutput * layer_outputs + io;
  }
  if (b.kind == "linear" || b.kind == "head") return in * out + kWorkPerLayerOutput * out + io;
  if (IsBottleneckBlock(b)) {
    // A 1x1 convolution or a linear layer at every position but the channels.
    double positions = 1;
    for (size_t d = 0; d < b.out_shape.size(); ++d) {
      if (d != ChannelDim(b.out_shape)) positions *= static_cast<double>(b.out_shape[d]);
    }
    return positions * (in * out + kWorkPerLayerOutput * out) + io;
  }
  // A script block's layers are unknown here: every parameter is taken to act
  // once per output pixel (a convolution's weights do; a linear layer's act
  // once per sample, and its output has one pixel).
  if (b.kind == "script") return static_cast<double>(b.parameters) * pixels + io;
  if (b.kind == "stem") {
    // The ImageNet stem's convolution strides by 2 and a max-pool halves again.
    const double conv_pixels = b.imagenet_stem ? 4 * pixels : pixels;
    return ConvWork(in, out, b.imagenet_stem ? 7 : 3, conv_pixels) + io;
  }
  if (b.kind == "reversible") {
    // One residual function on one stream of `out` channels.
    return BodyWork(out, mid, out, b.bottleneck, pixels, pixels) + io;
  }
  // residual / downsample: body plus a 1x1 projection when the shape changes;
  // on a RevNet pair each half is transformed (body + projection, projection).
  const double ci = b.pair ? in / 2 : in, co = b.pair ? out / 2 : out;
  double work = BodyWork(ci, mid, co, b.bottleneck, in_pixels, pixels);
  if (b.stride > 1 || b.in_channels != b.out_channels) work += ConvWork(ci, co, 1, pixels);
  if (b.pair) work += ConvWork(ci, co, 1, pixels);
  return work + io;
}

absl::StatusOr<std::vector<std::pair<int, int>>> ResolvePartition(
    const StagesSpec& stages, const std::vector<BlockInfo>& blocks) {
  const int num_blocks = static_cast<int>(blocks.size());
  std::vector<std::pair<int, int>> ranges;
  // stages.bottleneck: its cuts are the job's (the spec's ranges name the
  // model without them); another stage count cuts the whole model afresh.
  std::vector<int> downs;
  for (const BlockInfo& b : blocks) {
    if (b.kind == "bottleneck_down") downs.push_back(b.index);
  }
  if (!downs.empty() && static_cast<int>(downs.size()) + 1 == VirtualStages(stages)) {
    int begin = 0;
    for (int d : downs) {
      ranges.emplace_back(begin, d + 1);
      begin = d + 1;
    }
    ranges.emplace_back(begin, num_blocks);
    return ranges;
  }
  if (!stages.ranges.empty()) {
    int expect = 0;
    for (size_t j = 0; j < stages.ranges.size(); ++j) {
      const auto& [b, e] = stages.ranges[j];
      if (b != expect || e <= b) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stages.partition[", j, "]: ranges must be contiguous and non-empty, got [", b, ", ", e,
            ") after ", expect));
      }
      expect = e;
    }
    if (expect != num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("stages.partition: ranges end at block ",
                                                     expect, " but the model has ", num_blocks,
                                                     " blocks"));
    }
    return stages.ranges;
  }
  const int j = VirtualStages(stages);  // interleaved: count x chunks_per_worker
  if (j < 1 || j > num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stages.count: ", j, " stages",
        stages.chunks_per_worker > 1 ? absl::StrCat(" (", stages.count, " x ",
                                                    stages.chunks_per_worker, " chunks per worker)")
                                     : "",
        " for a model of ", num_blocks, " blocks (need 1..", num_blocks, ")"));
  }
  if (stages.partition != Partition::kEven) {
    // balanced (and auto's placeholder): the least estimated bottleneck.
    std::vector<double> prefix(num_blocks + 1, 0);
    for (int i = 0; i < num_blocks; ++i) prefix[i + 1] = prefix[i] + EstimateBlockWork(blocks[i]);
    planner::PartitionResult best = planner::MinMaxPartition(
        num_blocks, j, [&](int b, int e, int) { return prefix[e] - prefix[b]; });
    if (best.feasible) return best.ranges;
  }
  // Even split; the first (num_blocks % j) stages take one block more.
  int begin = 0;
  for (int s = 0; s < j; ++s) {
    const int len = num_blocks / j + (s < num_blocks % j ? 1 : 0);
    ranges.emplace_back(begin, begin + len);
    begin += len;
  }
  return ranges;
}

}  // namespace stagewise::models
