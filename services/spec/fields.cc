#include "services/spec/fields.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagewise::spec {
namespace {

// "`a`, `b`, `c`": an enum's spellings for an "allowed" column.
template <typename E>
std::string Choices() {
  std::vector<std::string> quoted;
  for (const std::string& name : EnumNames<E>()) quoted.push_back(absl::StrCat("`", name, "`"));
  return absl::StrJoin(quoted, ", ");
}

constexpr const char* kRequired = "—";

// A bound as the docs and errors show it: whole numbers in full (1000000,
// not 1e+06).
std::string BoundText(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v));
  return FormatDouble(v);
}

}  // namespace

std::string Range::Text() const {
  if (min.has_value() && max.has_value()) {
    return absl::StrCat(min_open ? "(" : "[", BoundText(*min), ", ", BoundText(*max),
                        max_open ? ")" : "]");
  }
  if (min.has_value()) return absl::StrCat(min_open ? "> " : ">= ", BoundText(*min));
  if (max.has_value()) return absl::StrCat(max_open ? "< " : "<= ", BoundText(*max));
  return "any number";
}

absl::Status Range::Check(absl::string_view path, double value) const {
  if (Contains(value)) return absl::OkStatus();
  const bool both = min.has_value() && max.has_value();
  return KeyError(path, absl::StrCat("must be ", both ? "in " : "", Text(), ", got ",
                                     std::isnan(value) ? "nan" : BoundText(value)));
}

// ---------------------------------------------------------------------------
// Plain sections. The "allowed" texts are docs/job_spec.md's; the ranges they
// state are checked in validate.cc.

const std::vector<Field<JobSpec>>& TopLevelFields() {
  using S = JobSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("name", &S::name, "**required**; `[A-Za-z0-9_.-]+`", kRequired),
      Key("seed", &S::seed, AtLeast(0), "seeds data order, augmentation and parameter init"),
      Key("device", &S::device,
          "`cpu`, `cuda`, `cuda:N`: a `cuda` job's stages go only to workers on a CUDA device "
          "(they wait for them); `local` puts worker n on `cuda:(n mod GPUs)`"),
      Key("priority", &S::priority,
          "a priority class of the coordinator's `--scheduling-config` (docs/operations.md, "
          "\"Sharing the cluster\"); empty: its default class"),
      Custom<S>("model", "map", kRequired, "see [model](#model); `model.name` is required"),
      Custom<S>("data", "map", kRequired, "see [data](#data); `data.dataset` is required"),
      Custom<S>("algorithm", "name or map", "`backprop`", "see [algorithm](#algorithm)"),
      Custom<S>("stages", "int or map", "`1`", "see [stages](#stages)"),
      Custom<S>("optimizer", "map", "SGD", "see [optimizer](#optimizer)"),
      Custom<S>("schedule", "map", "constant", "see [schedule](#schedule)"),
      Key("batch_size", &S::batch_size, AtLeast(1), "per mini-batch, whole pipeline"),
      Key("eval_batch_size", &S::eval_batch_size, AtLeast(0), "`0` = `batch_size`"),
      Key("epochs", &S::epochs, Between(0, 1e6), "fractions allowed"),
      Key("steps", &S::steps, Between(0, 1e12), ""),
      Custom<S>("eval", "map", "", "see [eval](#eval)"),
      Custom<S>("checkpoint", "map", "", "see [checkpoint](#checkpoint)"),
      Custom<S>("recovery", "map", "", "see [recovery](#recovery)"),
      Custom<S>("sync", "map", "every step", "see [sync](#sync)"),
      Custom<S>("placement", "map", "", "see [placement](#placement)"),
      Custom<S>("transport", "map", "", "see [transport](#transport)"),
      Custom<S>("phases", "list", "none",
                "see [phases](#phases); replaces `algorithm`, `epochs` and `steps`"),
      Custom<S>("script_model", "map", "none",
                "written by the CLI when it submits a `torchscript` model (its dry run); not "
                "written by hand"),
      Custom<S>("trace", "map", "off", "see [trace](#trace)"),
      Custom<S>("rebalance", "map", "off", "see [rebalance](#rebalance)"),
  };
  return *kFields;
}

const std::vector<Field<ModelSpec>>& ModelFields() {
  using S = ModelSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("name", &S::name,
          absl::StrCat("**required**: ", Choices<ModelKind>(),
                       " (your own model, see [torchscript.md](torchscript.md))"),
          kRequired),
      Key("depth", &S::depth,
          "resnet, `style: cifar`: `6n+2`, n >= 1 (20, 32, 56, 110, ...); resnet, `style: "
          "imagenet`: 18, 34, 50; revnet: 18, 34, 50; emulated: the number of emulated blocks, "
          "1..4096; mlp: unused. Required for resnet/revnet/emulated unless `blocks` is given"),
      Key("style", &S::style, Choices<ResNetStyle>() + " (resnet only; ignored otherwise)"),
      Key("small_input", &S::small_input,
          "imagenet-style resnet and revnet: 3x3 stem, no max-pool"),
      Key("width", &S::width, AtLeast(0), "base channels, `0` = the paper's default"),
      Key("blocks", &S::blocks, AtLeast(1),
          "blocks per group, **overrides `depth`**. resnet cifar: 3 entries; resnet "
          "imagenet and revnet: 4 entries"),
      Key("hidden", &S::hidden, AtLeast(1), "mlp hidden layer sizes (`[]` = linear classifier)"),
      Key("heads", &S::heads,
          "gpt/reformer: attention heads, `[1, 256]`, must divide `width` (see "
          "[text.md](text.md))"),
      Key("forward_ms", &S::forward_ms,
          "emulated: milliseconds each block waits in its forward per mini-batch of `batch_size` "
          "samples (a micro-batch waits its share), 0..3.6e6"),
      Key("backward_ms", &S::backward_ms, "emulated: the same for the backward"),
      Key("block_forward_ms", &S::block_forward_ms,
          "emulated: one `forward_ms` per block (`depth` entries), instead of `forward_ms`; e.g. "
          "a real job's profiled stage times (tests/bench/emulate_job.py)"),
      Key("block_backward_ms", &S::block_backward_ms,
          "emulated: one `backward_ms` per block, instead of `backward_ms`"),
      Key("backward_weight_share", &S::backward_weight_share,
          "emulated: [0, 1]; the part of `backward_ms` that is weight gradients (W, which "
          "`schedule: zb-h1` defers), the rest being the input gradient (B)"),
      Key("reversible", &S::reversible,
          "emulated: blocks are reversible couplings (PETRA, rebuild mode); needs an even "
          "`data.shape[0]`"),
      Key("path", &S::path,
          "torchscript: **required**, the TorchScript file, relative to the job file or absolute; "
          "not allowed with the other models",
          kRequired),
      Key("inverse_tolerance", &S::inverse_tolerance,
          "torchscript: (0, 1]; how closely a block's exported `inverse` must rebuild its input "
          "on the dry run"),
  };
  return *kFields;
}

const std::vector<Field<DataSpec>>& DataFields() {
  using S = DataSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("dataset", &S::dataset,
          absl::StrCat("**required**: ", Choices<DatasetKind>(),
                       " (the last two are byte-level text, see [text.md](text.md))"),
          kRequired),
      Key("path", &S::path,
          "directory; `\"\"` = the dataset's default. **Required** for `cifar10`/`cifar100` (the "
          "binary batches) and `text_file` (a UTF-8 file, under the worker's `--data-root`)"),
      Key("augment", &S::augment, "random crop with padding + horizontal flip"),
      Key("crop_padding", &S::crop_padding, AtLeast(0), ""),
      Key("horizontal_flip", &S::horizontal_flip, "used when `augment`"),
      Key("normalize", &S::normalize, "per-channel mean/std of the training set"),
      Key("train_size", &S::train_size,
          "text: sequences per training epoch, `[1, 10000000]`; synthetic: `[1, 10000000]`, and "
          "`train_size` × (C × H × W + 8) bytes at most 1 "
          "GiB"),
      Key("test_size", &S::test_size, "synthetic only, `>= 1`; the same cap"),
      Key("shape", &S::shape, "synthetic only: `[C, H, W]`, each in `[1, 4096]`"),
      Key("classes", &S::classes, "synthetic only, `[2, 1000000]`"),
      Key("limit_train", &S::limit_train, AtLeast(0),
          "use only the first N training samples (`0` = all)"),
      Key("limit_test", &S::limit_test, AtLeast(0), "same for the test set"),
      Key("sequence_length", &S::sequence_length,
          "text: bytes per sequence, `[2, 4096]`, at most the evaluated split's size"),
      Key("min_sequence_length", &S::min_sequence_length,
          "text: `0` = every training sequence is `sequence_length` long; else each mini-batch "
          "draws its length in `[min_sequence_length, sequence_length]`"),
      Key("eval_split", &S::eval_split,
          absl::StrCat("text: ", Choices<TextSplit>(),
                       "; the held-out part the evaluation reads (90/5/5 split)")),
  };
  return *kFields;
}

const std::vector<Field<OptimizerSpec>>& OptimizerFields() {
  using S = OptimizerSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("name", &S::name, Choices<OptimizerKind>()),
      Key("lr", &S::lr, AtLeast(0),
          "base learning rate; 0 freezes the parameters, as the oracles do"),
      Key("momentum", &S::momentum, Between(0, 1, false, true),
          "sgd and muon (muon: 0.95 is usual)"),
      Key("nesterov", &S::nesterov, "sgd and muon: requires `momentum > 0`"),
      Key("weight_decay", &S::weight_decay, AtLeast(0), ""),
      Key("exclude_bn_and_bias", &S::exclude_bn_and_bias,
          "no weight decay on BatchNorm parameters and biases"),
      Key("beta1", &S::beta1, Between(0, 1, false, true), "adam"),
      Key("beta2", &S::beta2, Between(0, 1, false, true), "adam"),
      Key("eps", &S::eps, Above(0), "adam, and muon's Adam part"),
      Key("adam_lr", &S::adam_lr, AtLeast(0),
          "muon: the learning rate of the parameters of rank < 2 (biases, norms), which Adam "
          "steps with `beta1`, `beta2`, `eps`; `0` = `lr`; the schedule scales it as `lr`"),
      Key("newton_schulz_steps", &S::newton_schulz_steps, Between(1, 20),
          "muon: Newton-Schulz iterations that orthogonalise each update"),
      Key("scale_lr_by_batch", &S::scale_lr_by_batch,
          "Goyal et al. rule: lr x batch_size x k / 256"),
  };
  return *kFields;
}

const std::vector<Field<ScheduleSpec>>& ScheduleFields() {
  using S = ScheduleSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("name", &S::name, Choices<LrScheduleKind>()),
      Key("warmup_epochs", &S::warmup_epochs, AtLeast(0),
          "linear warm-up from 0, fractions allowed"),
      Key("milestones", &S::milestones,
          "multistep: epochs where lr *= gamma; `> 0`, strictly increasing; at least one for "
          "`multistep`"),
      Key("gamma", &S::gamma, Between(0, 1, true, false), ""),
      Key("min_lr", &S::min_lr, AtLeast(0), "cosine: the final lr"),
  };
  return *kFields;
}

const std::vector<Field<EvalSpec>>& EvalFields() {
  using S = EvalSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("every_epochs", &S::every_epochs, AtLeast(0), "`0` = only at the end"),
      Key("every_steps", &S::every_steps, AtLeast(0), "`0` = off"),
      Key("at_end", &S::at_end, ""),
  };
  return *kFields;
}

const std::vector<Field<CheckpointSpec>>& CheckpointFields() {
  using S = CheckpointSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("dir", &S::dir, "`\"\"` = no checkpoints"),
      Key("every_epochs", &S::every_epochs, AtLeast(0), "`> 0` requires `dir`"),
      Key("every_steps", &S::every_steps, AtLeast(0), "`> 0` requires `dir`"),
      Key("keep", &S::keep, AtLeast(1), "newest committed checkpoints kept"),
  };
  return *kFields;
}

const std::vector<Field<RecoverySpec>>& RecoveryFields() {
  using S = RecoverySpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("max_restarts", &S::max_restarts, AtLeast(0),
          "attempts that may end early (lost worker, coordinator restart, retryable "
          "error) before the job fails"),
      Key("wait_seconds", &S::wait_seconds, Above(0),
          "how long a recovering job waits for enough idle workers"),
      Key("from_scratch", &S::from_scratch,
          "without a committed checkpoint, restart from step 0 (`false`: fail)"),
      Key("stall_seconds", &S::stall_seconds, Between(0, 1e9),
          "a running job whose step does not advance for this long is recovered as if "
          "a stage were lost (cause `stalled`); `0` = 20x the median step time so far, at least "
          "300"),
      Key("elastic", &S::elastic,
          "replicated stages: a recovering job short of `count x replicas` idle workers "
          "continues with fewer replicas of every stage (the most idle, dividing `batch_size`) "
          "instead of waiting; same global batch and learning rate"),
      Key("min_stages", &S::min_stages,
          "`0` (off) or `1..stages.count`; a recovering job still short of workers for all its "
          "stages after `wait_seconds` resumes on fewer stages, at least this many, its "
          "checkpoint regrouped onto a balanced cut (exact for backprop; see "
          "[fault_tolerance.md](fault_tolerance.md#fewer-stages)); it waits another "
          "`wait_seconds` for those, and grows back when workers are idle again"),
      Key("replay", &S::replay,
          "a lost worker's stage starts again on an idle worker inside the running attempt and "
          "replays what its neighbours sent it since its last committed shard; the other "
          "stages redo nothing; with `stages.replicas` > 1 a lost replica copies a surviving "
          "replica's live state instead (needs `checkpoint.dir`, one chunk per worker, and with "
          "replicas backprop and `sync.every: 1`; see "
          "[fault_tolerance.md](fault_tolerance.md#replacing-one-stage))"),
  };
  return *kFields;
}

const std::vector<Field<SyncSpec>>& SyncFields() {
  using S = SyncSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("every", &S::every, Between(1, 1e6),
          "`1`: the replicas of a stage average their gradients before every "
          "optimizer step; `H > 1` (needs `stages.replicas > 1`): each replica takes H optimizer "
          "steps on its own, then the replicas average their parameter moves and `outer` "
          "applies them"),
      Key("outer", &S::outer,
          absl::StrCat(Choices<OuterOptimizer>(),
                       ": the outer optimizer of `every > 1` (SGD on the averaged move, with "
                       "Nesterov momentum or plain momentum)")),
      Key("lr", &S::lr, Between(0, 1000, true, false),
          "the outer learning rate (`1` with `momentum: 0` and `outer: "
          "sgd` is plain parameter averaging)"),
      Key("momentum", &S::momentum, Between(0, 1, false, true),
          "the outer momentum (`nesterov` needs `> 0`)"),
      Key("overlap", &S::overlap,
          "with `every: 1` and backprop: a bucket of gradients starts its all-reduce as soon as "
          "the step's last backward has produced it, while the backward goes on (opt-in for now, "
          "see replicas.md); `false` averages after the backward"),
      Key("bucket_mb", &S::bucket_mb, Between(0, 1024, true, false),
          "gradients travel in flat buckets of at most this many MiB (a larger "
          "tensor alone); smaller buckets start earlier during an overlapped backward, larger "
          "ones make fewer all-reduces"),
  };
  return *kFields;
}

const std::vector<Field<PlacementSpec>>& PlacementFields() {
  using S = PlacementSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("distinct_identities", &S::distinct_identities,
          "no two stages of the job on workers with the same certificate identity (TLS); "
          "`false` for clusters that issue one certificate to several workers"),
      Key("per_worker_profiles", &S::per_worker_profiles,
          "with `stages.partition: auto`: profile the model on every worker of the job and plan "
          "each stage on the times of the worker that runs it (machines of different speeds; "
          "see [planner.md](planner.md#heterogeneous-workers))"),
      Key("labels", &S::labels,
          "`key=value` entries, e.g. `[gpu=a100]`: only workers started with every one of "
          "these (`stagewise-worker --label gpu=a100`) take the job's stages; it waits for "
          "enough of them"),
      Key("link_gbps", &S::link_gbps, Between(0, 1e9),
          "the bandwidth between neighbouring workers in Gbit/s, for the planner "
          "(`stages.partition: auto`): a stage's time includes sending its output forward and "
          "its input's gradient back, so cuts avoid large activations on slow links; `0` = not "
          "modelled (see [planner.md](planner.md#links))"),
      Key("link_rtt_ms", &S::link_rtt_ms, Between(0, 1e9),
          "the round trip between neighbouring workers in ms (half of it per message), "
          "with `link_gbps`"),
  };
  return *kFields;
}

const std::vector<Field<RebalanceSpec>>& RebalanceFields() {
  using S = RebalanceSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("threshold", &S::threshold, Between(0, 10),
          "`0` is off; else rebalance when the slowest stage's time per mini-batch, over "
          "its plan, exceeds the median stage's by this fraction (0.15: 15%)"),
      Key("window_steps", &S::window_steps, AtLeast(1),
          "... for this many steps in a row (measured since the attempt started)"),
      Key("max_per_hour", &S::max_per_hour, Between(0, 3600, true, false),
          "at most this many rebalances per hour"),
  };
  return *kFields;
}

namespace {
constexpr char kBlockDoc[] =
    "a power of two; `int8`/`int4`: values that share one scale (smaller blocks: finer scales, "
    "4 more bytes a block)";
constexpr char kRotateDoc[] =
    "`int8`/`int4`: rotate each block by a random Hadamard transform before quantizing (spreads "
    "outliers over the block; the receiver rotates back)";
}  // namespace

const std::vector<Field<TransportSpec>>& TransportFields() {
  using S = TransportSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("compression", &S::compression,
          absl::StrCat(Choices<Compression>(),
                       ": how float32 activations and gradients travel between stages. "
                       "`fp16`/`bf16` send 2 bytes per value instead of 4 (the receiver widens "
                       "them back to float32); `int8`/`int4` send 1 or 1/2 byte per value plus "
                       "a float32 scale per `block` values (block-wise, symmetric; a tensor "
                       "with a NaN or an infinity goes uncompressed); labels and other dtypes "
                       "go as they are. `auto`: the planner picks for each stage the least lossy "
                       "of `none`, `bf16`, `int8`, `int4` whose time on the link for all the "
                       "stage sends (`placement.link_gbps`, which it needs) fits under its "
                       "compute, and `stagewise plan` shows the choice")),
      Key("block", &S::block, Between(16, 4096), kBlockDoc),
      Key("rotate", &S::rotate, kRotateDoc),
      Key("error_feedback", &S::error_feedback,
          "gradients sent with a lossy format (`transport.backward`) carry what the last send of "
          "the same micro-batch slot lost (the residual, kept per slot and checkpointed)"),
      Custom<S>("forward", "map", "the top-level keys",
                "`compression`, `block`, `rotate` for activations (towards stage j+1, "
                "evaluations too)"),
      Custom<S>("backward", "map", "the top-level keys",
                "`compression`, `block`, `rotate` for gradients (towards stage j-1)"),
  };
  return *kFields;
}

const std::vector<Field<WireFormatSpec>>& WireFormatFields() {
  using S = WireFormatSpec;
  static const auto* const kFields = new std::vector<Field<S>>{
      Key("compression", &S::compression, Choices<Compression>(), "`transport.compression`"),
      Key("block", &S::block, Between(16, 4096), kBlockDoc, "`transport.block`"),
      Key("rotate", &S::rotate, kRotateDoc, "`transport.rotate`"),
  };
  return *kFields;
}

// ---------------------------------------------------------------------------
// Algorithm parameters (what each algorithm does: docs/algorithms.md).

namespace {

template <typename O>
O& Of(AlgorithmOptions* options) {
  return std::get<O>(*options);
}

template <typename O>
ParamField IntParam(std::string key, int O::*member, Range range, std::string doc) {
  ParamField p;
  p.key = std::move(key);
  p.type = ParamType::kInt;
  p.range = range;
  p.doc = std::move(doc);
  p.set = [member](AlgorithmOptions* o, absl::string_view text) {
    int64_t value = 0;
    ParseIntText(text, &value);
    Of<O>(o).*member = static_cast<int>(value);
  };
  p.get = [member](const AlgorithmOptions& o) { return absl::StrCat(std::get<O>(o).*member); };
  return p;
}

// An integer key that also takes the word `auto`, stored as `auto_value`
// (outside `range`).
template <typename O>
ParamField IntOrAutoParam(std::string key, int O::*member, int auto_value, Range range,
                          std::string doc) {
  ParamField p = IntParam(std::move(key), member, range, std::move(doc));
  p.auto_word = "auto";
  p.set = [member, auto_value](AlgorithmOptions* o, absl::string_view text) {
    int64_t value = auto_value;
    if (text != "auto") ParseIntText(text, &value);
    Of<O>(o).*member = static_cast<int>(value);
  };
  p.get = [member, auto_value](const AlgorithmOptions& o) {
    const int value = std::get<O>(o).*member;
    return value == auto_value ? std::string("auto") : absl::StrCat(value);
  };
  return p;
}

template <typename O>
ParamField DoubleParam(std::string key, double O::*member, Range range, std::string doc) {
  ParamField p;
  p.key = std::move(key);
  p.type = ParamType::kDouble;
  p.range = range;
  p.doc = std::move(doc);
  p.set = [member](AlgorithmOptions* o, absl::string_view text) {
    ParseDoubleText(text, &(Of<O>(o).*member));
  };
  p.get = [member](const AlgorithmOptions& o) { return FormatDouble(std::get<O>(o).*member); };
  return p;
}

template <typename O>
ParamField BoolParam(std::string key, bool O::*member, std::string doc) {
  ParamField p;
  p.key = std::move(key);
  p.type = ParamType::kBool;
  p.doc = std::move(doc);
  p.set = [member](AlgorithmOptions* o, absl::string_view text) {
    ParseBoolText(text, &(Of<O>(o).*member));
  };
  p.get = [member](const AlgorithmOptions& o) {
    return std::string(std::get<O>(o).*member ? "true" : "false");
  };
  return p;
}

// A non-empty free-form string (a sub-network spec such as "conv").
template <typename O>
ParamField StringParam(std::string key, std::string O::*member, std::string doc) {
  ParamField p;
  p.key = std::move(key);
  p.type = ParamType::kString;
  p.doc = std::move(doc);
  p.set = [member](AlgorithmOptions* o, absl::string_view text) {
    Of<O>(o).*member = std::string(text);
  };
  p.get = [member](const AlgorithmOptions& o) { return std::get<O>(o).*member; };
  return p;
}

template <typename O, typename E>
ParamField EnumParam(std::string key, E O::*member, std::string doc) {
  ParamField p;
  p.key = std::move(key);
  p.type = ParamType::kEnum;
  p.choices = EnumNames<E>();
  p.doc = std::move(doc);
  p.set = [member](AlgorithmOptions* o, absl::string_view text) {
    Of<O>(o).*member = *EnumFromName<E>(text);
  };
  p.get = [member](const AlgorithmOptions& o) {
    return std::string(NameOf(std::get<O>(o).*member));
  };
  return p;
}

// An enum key whose `none` spelling is the empty optional (schedule: auto).
template <typename O, typename E>
ParamField OptionalEnumParam(std::string key, std::optional<E> O::*member, absl::string_view none,
                             std::string doc) {
  ParamField p;
  p.key = std::move(key);
  p.type = ParamType::kEnum;
  p.choices = EnumNames<E>();
  p.choices.emplace_back(none);
  p.doc = std::move(doc);
  p.set = [member, none = std::string(none)](AlgorithmOptions* o, absl::string_view text) {
    Of<O>(o).*member = text == none ? std::nullopt : EnumFromName<E>(text);
  };
  p.get = [member, none = std::string(none)](const AlgorithmOptions& o) {
    const std::optional<E>& value = std::get<O>(o).*member;
    return value.has_value() ? std::string(NameOf(*value)) : none;
  };
  return p;
}

template <typename O>
AlgorithmSchema Schema(AlgorithmKind kind, std::vector<ParamField> params) {
  AlgorithmSchema schema{kind, std::move(params), O{}};
  return schema;
}

static_assert(
    std::is_same_v<
        std::variant_alternative_t<static_cast<size_t>(AlgorithmKind::kAuxNet), AlgorithmOptions>,
        AuxNetOptions> &&
        std::variant_size_v<AlgorithmOptions> == EnumSpellings<AlgorithmKind>::kNames.size(),
    "AlgorithmOptions' alternatives follow AlgorithmKind");

}  // namespace

const std::vector<AlgorithmSchema>& AlgorithmSchemas() {
  using B = BackpropOptions;
  using D = DelayedOptions;
  using P = PetraOptions;
  using N = NwiseOptions;
  using A = AuxNetOptions;
  static const auto* const kSchemas = new std::vector<AlgorithmSchema>{
      Schema<B>(
          AlgorithmKind::kBackprop,
          {IntParam("micro_batches", &B::micro_batches, AtLeast(1), "`<= batch_size`"),
           OptionalEnumParam("schedule", &B::schedule, kAutoScheduleName, ""),
           BoolParam("recompute", &B::recompute, "keep only stage inputs, recompute in backward"),
           IntParam("lookahead", &B::lookahead, AtLeast(0),
                    "1f1b and zb-h1: extra micro-batches in flight per stage (to hide message "
                    "latency)")}),
      Schema<D>(AlgorithmKind::kDelayed,
                {EnumParam("weights", &D::weights, ""),
                 EnumParam("forward", &D::forward,
                           "`once`: each forward keeps its graph, taken at a copy of the weights "
                           "it used, until the gradient returns (one forward per mini-batch, a "
                           "graph per mini-batch in flight); `recompute`: a graph-free forward "
                           "keeping the stage's input, run again with a graph when the gradient "
                           "returns (one more forward, least memory); `auto`: `once` with "
                           "`weights: stash`, else `recompute`"),
                 BoolParam("predict_weights", &D::predict_weights,
                           "`weights: stash` only: each forward (and its stash) uses the weights "
                           "extrapolated along the last update by the stage's staleness s, "
                           "w + s (w - w_prev), which predicts the weights its gradient will be "
                           "applied to"),
                 EnumParam("lr_by_delay", &D::lr_by_delay,
                           "stage j's learning rate x 1, 1/(1+s_j) or 1/sqrt(1+s_j), s_j its "
                           "staleness in steps"),
                 EnumParam("momentum_by_delay", &D::momentum_by_delay,
                           "`optimizer.name: sgd` or `adam`: `compensate` runs stage j at "
                           "momentum (Adam: beta1) max(0, m - s_j / (1 + s_j)), the delay acting "
                           "as momentum of its own"),
                 IntOrAutoParam("max_in_flight", &D::max_in_flight, kAutoInFlight, AtLeast(0),
                                "cap on mini-batches in flight per stage; `0` = the natural depth "
                                "2(J-1-j)+1 at stage j; `auto`: the depth that covers the round "
                                "trip of `placement.link_rtt_ms` at the planned time per step "
                                "(the plan's `plan.stage<j>.in_flight`; the natural one on links "
                                "without latency)"),
                 IntParam("accumulation", &D::accumulation, AtLeast(1),
                          "k: every stage steps once per k backward passes with their mean "
                          "gradient (bounded accumulation, as PACI), so a mini-batch's forward "
                          "and backward are at most ceil(s_j / k) updates apart; the corrections "
                          "above take s_j / k; `scale_lr_by_batch` counts k x `batch_size`")}),
      Schema<FeaturesReplayOptions>(AlgorithmKind::kFeaturesReplay, {}),
      Schema<P>(AlgorithmKind::kPetra,
                {IntParam("accumulation", &P::accumulation, AtLeast(1),
                          "k: step every k backward passes"),
                 BoolParam("verify_rebuild", &P::verify_rebuild,
                           "diagnostic: also keep every reversible block's forward input and "
                           "report how far the rebuilt one is from it (`rebuild_error.block<i>` "
                           "in the job summary); costs the memory PETRA saves"),
                 BoolParam("predict_weights", &P::predict_weights,
                           "each forward runs at the weights extrapolated along the last update "
                           "by the stage's staleness s_j = 2(J-1-j)/k, w + s_j (w - w_prev), "
                           "near the weights its backward rebuilds with; one parameter copy"),
                 EnumParam("lr_by_delay", &P::lr_by_delay,
                           "stage j's learning rate x 1, 1/(1+s_j) or 1/sqrt(1+s_j), s_j its "
                           "staleness in updates"),
                 EnumParam("momentum_by_delay", &P::momentum_by_delay,
                           "`optimizer.name: sgd` or `adam`: `compensate` runs stage j at "
                           "momentum (Adam: beta1) max(0, m - s_j / (1 + s_j))")}),
      Schema<N>(AlgorithmKind::kNwise,
                {IntParam("n", &N::n, AtLeast(1), "`<= stages.count`"),
                 BoolParam("mix_local", &N::mix_local, ""),
                 IntParam("micro_batches", &N::micro_batches, AtLeast(1), "`<= batch_size`"),
                 StringParam("aux_head", &N::aux_head,
                             "the auxiliary heads: `conv` (the paper's), `conv:C1,C2,...` or "
                             "`linear`")}),
      Schema<A>(
          AlgorithmKind::kAuxNet,
          {DoubleParam("beta", &A::beta, Above(0),
                       "penalty weight; the paper's default, for ψ an element-wise mean"),
           DoubleParam("beta_factor", &A::beta_factor, AtLeast(1), "beta is multiplied by it ..."),
           IntParam("beta_every_epochs", &A::beta_every_epochs, AtLeast(0),
                    "... every this many epochs (`0` = never)"),
           DoubleParam("aux_lr", &A::aux_lr, AtLeast(0), "step size for the auxiliary variables"),
           EnumParam("auxnet", &A::auxnet,
                     "`resnet`: strided conv3x3-BN-ReLU, then basic residual blocks; `conv`: the "
                     "strided conv3x3-BN-ReLU alone; vector boundaries use a linear layer"),
           IntParam("auxnet_blocks", &A::auxnet_blocks, AtLeast(1),
                    "residual blocks of a `resnet` AuxNet (its capacity)"),
           IntParam("serial_loss_every", &A::serial_loss_every, AtLeast(0),
                    "every this many steps the last stage reports the training loss of the true "
                    "serial forward (`0` = never)"),
           DoubleParam("noise_std", &A::noise_std, AtLeast(0),
                       "Gaussian noise added to every auxiliary variable fed forward"),
           EnumParam("bn_statistics", &A::bn_statistics,
                     "BatchNorm running statistics move in the local forward from λ, or only in "
                     "the serial forward (`serial` needs `serial_loss_every >= 1`)"),
           EnumParam("aux_update", &A::aux_update,
                     "`distill`: correct λ with step `aux_lr`, then one step fitting the AuxNet "
                     "to it (Algorithm 1); `direct`: the AuxNet gets β ∂ψ/∂λ + p through λ, the "
                     "paper's ReAuxNet rule (`aux_lr` unused)"),
           EnumParam("penalty", &A::penalty,
                     "`mse`: ψ = mean squared difference, the paper's; `relative`: ψ divided by "
                     "the mean square of its two sides, so outputs and auxiliary variables gain "
                     "nothing by shrinking together (see [results.md](results.md#auxnet))")}),
  };
  return *kSchemas;
}

const AlgorithmSchema* FindAlgorithm(absl::string_view name) {
  const std::optional<AlgorithmKind> kind = EnumFromName<AlgorithmKind>(name);
  if (!kind) return nullptr;
  return &AlgorithmSchemas()[static_cast<size_t>(*kind)];
}

std::vector<std::string> ParamKeys(const AlgorithmSchema& schema) {
  std::vector<std::string> keys;
  for (const ParamField& param : schema.params) keys.push_back(param.key);
  return keys;
}

std::string UnknownAlgorithmMessage(absl::string_view name) {
  const std::vector<std::string> names = EnumNames<AlgorithmKind>();
  if (name.empty()) {
    return absl::StrCat("required (one of ", absl::StrJoin(names, ", "), ")");
  }
  std::string message = absl::StrCat("unknown algorithm '", Clip(name), "'");
  if (auto suggestion = Suggest(name, names)) {
    absl::StrAppend(&message, " (did you mean ", *suggestion, "?)");
  }
  absl::StrAppend(&message, "; known: ", absl::StrJoin(names, ", "));
  return message;
}

std::string UnknownParamMessage(const AlgorithmSchema& schema, absl::string_view key) {
  const std::vector<std::string> keys = ParamKeys(schema);
  std::string message = absl::StrCat("unknown key for algorithm ", NameOf(schema.kind));
  if (keys.empty()) {
    absl::StrAppend(&message, " (it takes no parameters)");
  } else {
    absl::StrAppend(&message, " (");
    if (auto suggestion = Suggest(key, keys)) {
      absl::StrAppend(&message, "did you mean algorithm.", *suggestion, "? ");
    }
    absl::StrAppend(&message, "known: ", absl::StrJoin(keys, ", "), ")");
  }
  return message;
}

const char* ExpectedText(ParamType type) {
  switch (type) {
    case ParamType::kInt:
      return "an integer";
    case ParamType::kDouble:
      return "a number";
    case ParamType::kBool:
      return "a boolean (true or false)";
    case ParamType::kString:
    case ParamType::kEnum:
      break;
  }
  return "a string";
}

absl::StatusOr<std::string> CanonicalParam(const ParamField& param, absl::string_view text) {
  const std::string path = JoinPath("algorithm", param.key);
  auto type_error = [&] {
    return KeyError(
        path, absl::StrCat("expected ", ExpectedText(param.type), ", got '", Clip(text), "'"));
  };
  switch (param.type) {
    case ParamType::kInt: {
      if (!param.auto_word.empty() && text == param.auto_word) return std::string(text);
      int64_t value = 0;
      if (!ParseIntText(text, &value)) {
        if (param.auto_word.empty()) return type_error();
        return KeyError(path, absl::StrCat("expected an integer or ", param.auto_word, ", got '",
                                           Clip(text), "'"));
      }
      if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
        return KeyError(
            path, absl::StrCat("expected an integer that fits in 32 bits, got '", Clip(text), "'"));
      }
      if (absl::Status s = param.range.Check(path, static_cast<double>(value)); !s.ok()) return s;
      return absl::StrCat(value);
    }
    case ParamType::kDouble: {
      double value = 0;
      if (!ParseDoubleText(text, &value)) return type_error();
      if (absl::Status s = param.range.Check(path, value); !s.ok()) return s;
      return FormatDouble(value);
    }
    case ParamType::kBool: {
      bool value = false;
      if (!ParseBoolText(text, &value)) return type_error();
      return std::string(value ? "true" : "false");
    }
    case ParamType::kString:
      if (text.empty()) return KeyError(path, "must not be empty");
      return std::string(text);
    case ParamType::kEnum:
      if (!Contains(param.choices, text)) {
        return KeyError(path, ChoiceMessage(text, param.choices));
      }
      return std::string(text);
  }
  return absl::InternalError("unreachable");
}

std::string AlgorithmTable() {
  std::string table = "| algorithm | key | type | default | allowed |\n|---|---|---|---|---|\n";
  for (const AlgorithmSchema& schema : AlgorithmSchemas()) {
    const std::string name = absl::StrCat("`", NameOf(schema.kind), "`");
    if (schema.params.empty()) {
      absl::StrAppend(&table, "| ", name, " | | | | no parameters |\n");
      continue;
    }
    bool first = true;
    for (const ParamField& p : schema.params) {
      static constexpr const char* kTypes[] = {"int", "number", "bool", "string", "string"};
      std::string allowed;
      if (p.type == ParamType::kInt || p.type == ParamType::kDouble) {
        allowed = absl::StrCat("`", p.range.Text(), "`");
        if (!p.auto_word.empty()) absl::StrAppend(&allowed, " or `", p.auto_word, "`");
      } else if (p.type == ParamType::kEnum) {
        std::vector<std::string> quoted;
        for (const std::string& c : p.choices) quoted.push_back(absl::StrCat("`", c, "`"));
        allowed = absl::StrJoin(quoted, ", ");
      }
      if (!p.doc.empty()) absl::StrAppend(&allowed, allowed.empty() ? "" : "; ", p.doc);
      absl::StrAppend(&table, "| ", first ? name : "", " | `", p.key, "` | ",
                      kTypes[static_cast<int>(p.type)], " | `", p.get(schema.defaults), "` | ",
                      allowed, " |\n");
      first = false;
    }
  }
  return table;
}

}  // namespace stagewise::spec

// ---------------------------------------------------------------------------
// The public entry points of job_spec.h that the schema answers.

namespace stagewise {

absl::StatusOr<AlgorithmSpec> MakeAlgorithmSpec(const std::string& name,
                                                const std::map<std::string, std::string>& params) {
  const spec::AlgorithmSchema* schema = spec::FindAlgorithm(name);
  if (schema == nullptr) {
    return spec::KeyError("algorithm.name", spec::UnknownAlgorithmMessage(name));
  }
  const std::vector<std::string> keys = spec::ParamKeys(*schema);
  for (const auto& [key, value] : params) {
    if (!spec::Contains(keys, key)) {
      return spec::KeyError(spec::JoinPath("algorithm", spec::Clip(key)),
                            spec::UnknownParamMessage(*schema, key));
    }
  }
  AlgorithmSpec out{schema->defaults};
  for (const spec::ParamField& param : schema->params) {
    auto it = params.find(param.key);
    if (it == params.end()) continue;
    absl::StatusOr<std::string> canonical = spec::CanonicalParam(param, it->second);
    if (!canonical.ok()) return canonical.status();
    param.set(&out.options, *canonical);
  }
  return out;
}

std::map<std::string, std::string> AlgorithmParams(const AlgorithmSpec& spec) {
  std::map<std::string, std::string> params;
  const spec::AlgorithmSchema& schema = spec::AlgorithmSchemas()[spec.options.index()];
  for (const spec::ParamField& param : schema.params) {
    params[param.key] = param.get(spec.options);
  }
  return params;
}

std::vector<std::string> KnownAlgorithms() { return EnumNames<AlgorithmKind>(); }

int64_t AccumulationFactor(const AlgorithmSpec& spec) {
  if (const PetraOptions* petra = spec.get_if<PetraOptions>()) return petra->accumulation;
  if (const DelayedOptions* delayed = spec.get_if<DelayedOptions>()) return delayed->accumulation;
  return 1;
}

}  // namespace stagewise
