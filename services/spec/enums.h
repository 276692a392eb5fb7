// The closed sets of the job spec, as enums with their spellings. This is the
// only place that knows how a closed-set value is written in YAML; everything
// else compares enums (tests/layering/check_layering.sh greps for string
// comparisons against these names outside services/spec/).
// No LibTorch, no yaml-cpp: the coordinator, the CLI and the workers share it.
#ifndef STAGEWISE_SERVICES_SPEC_ENUMS_H_
#define STAGEWISE_SERVICES_SPEC_ENUMS_H_

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace stagewise {

// algorithm.name. The order is the order of AlgorithmOptions' alternatives
// (job_spec.h) and of the schema table (docs/job_spec.md).
enum class AlgorithmKind { kBackprop, kDelayed, kFeaturesReplay, kPetra, kNwise, kAuxNet };

// backprop's `schedule`: the order of micro-batches in a pipelined step, the
// one schedule type of the spec, the planner, the simulator and the worker
// (services/planner/pipeline_schedule.h). `schedule: auto` is no schedule
// (an empty std::optional in BackpropOptions): the planner picks the fastest
// of gpipe, 1f1b and zb-h1 that fits the memory caps (first phase only;
// docs/algorithms.md).
//   kGpipe:       all forwards, then all backwards;
//   kOneFOneB:    J-1-j forwards (+ lookahead), then one forward one backward;
//   kZbH1:        B and W split, stage j's W j micro-batches behind its B
//                 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023);
//   kInterleaved: 1F1B over stages.chunks_per_worker non-adjacent chunks per
//                 worker, virtual stages j, j + J, ..., j + (v-1)J of a
//                 J*v-stage pipeline (Narayanan et al. 2021).
enum class PipelineSchedule { kGpipe, kOneFOneB, kZbH1, kInterleaved };
// How `schedule: auto` is spelt.
inline constexpr absl::string_view kAutoScheduleName = "auto";

// delayed's `weights`: which parameters a late backward uses.
enum class DelayedWeights { kStash, kCurrent };
// delayed's `forward`: once keeps each forward's graph (and the weights it
// used) until the gradient returns; recompute runs the forward graph-free and
// again when the gradient returns; auto is once with `weights: stash`, else
// recompute.
enum class DelayedForward { kAuto, kOnce, kRecompute };
// delayed's and petra's `lr_by_delay`: stage j's learning rate scaled by its staleness
// s_j (constant: not; inverse: 1/(1+s_j); inverse_sqrt: 1/sqrt(1+s_j)).
enum class DelayLr { kConstant, kInverse, kInverseSqrt };
// delayed's and petra's `momentum_by_delay`: constant, or compensate (SGD's momentum
// lowered by the momentum the delay itself implies, s_j / (1 + s_j)).
enum class DelayMomentum { kConstant, kCompensate };

// auxnet's `auxnet`, `bn_statistics`, `aux_update` and `penalty`.
enum class AuxNetArch { kResnet, kConv };
enum class BnStatistics { kLocal, kSerial };
enum class AuxUpdate { kDistill, kDirect };
enum class AuxPenalty { kMse, kRelative };

// model.name: the zoo's networks, the emulated accelerator, a user's
// TorchScript file; model.style for resnet.
enum class ModelKind { kMlp, kResNet, kRevNet, kEmulated, kTorchScript, kGpt, kReformer };
enum class ResNetStyle { kCifar, kImageNet };

// data.dataset: image sets, and byte-level text (docs/text.md).
enum class DatasetKind { kFashionMnist, kCifar10, kCifar100, kSynthetic, kFortunes, kTextFile };
// data.eval_split: which held-out part of a text corpus the evaluation reads.
enum class TextSplit { kValidation, kTest };

// stages.partition: kExplicit is what a list of ranges means; it has no
// keyword of its own.
enum class Partition { kBalanced, kEven, kAuto, kExplicit };

// stages.modes: how reversible blocks run (planner).
enum class BlockModes { kAuto, kStore, kRebuild };
// One block's mode, as the planner chose it: a StageAssignment's and a
// checkpoint manifest's block_modes, spelt as in stages.modes.
enum class BlockMode { kStore, kRebuild };

// transport.compression: float32 activations and gradients on the wire.
// kAuto: the planner picks one of the others per stage and direction, for
// placement.link_gbps (planner::ChooseWire); a stage without a choice sends
// kNone.
enum class Compression { kNone, kFp16, kBf16, kInt8, kInt4, kAuto };
// `compression: auto` resolved for one stage: what it sends forward
// (activations) and backward (gradients).
struct WireChoice {
  Compression forward = Compression::kNone;
  Compression backward = Compression::kNone;
  bool operator==(const WireChoice& o) const {
    return forward == o.forward && backward == o.backward;
  }
};

// optimizer.name and schedule.name. muon: momentum orthogonalised by
// Newton-Schulz iterations for the weights of rank >= 2, Adam for the rest.
enum class OptimizerKind { kSgd, kAdam, kMuon };
// sync.outer: the outer optimizer of replicas that synchronise every H steps.
enum class OuterOptimizer { kSgd, kNesterov };
enum class LrScheduleKind { kConstant, kMultistep, kCosine };

// The spellings of each enum, indexed by its value.
template <typename E>
struct EnumSpellings;

template <>
struct EnumSpellings<AlgorithmKind> {
  static constexpr std::array<absl::string_view, 6> kNames = {
      "backprop", "delayed", "features_replay", "petra", "nwise", "auxnet"};
};
template <>
struct EnumSpellings<PipelineSchedule> {
  static constexpr std::array<absl::string_view, 4> kNames = {"gpipe", "1f1b", "zb-h1",
                                                              "interleaved"};
};
template <>
struct EnumSpellings<DelayedWeights> {
  static constexpr std::array<absl::string_view, 2> kNames = {"stash", "current"};
};
template <>
struct EnumSpellings<DelayedForward> {
  static constexpr std::array<absl::string_view, 3> kNames = {"auto", "once", "recompute"};
};
template <>
struct EnumSpellings<DelayLr> {
  static constexpr std::array<absl::string_view, 3> kNames = {"constant", "inverse",
                                                              "inverse_sqrt"};
};
template <>
struct EnumSpellings<DelayMomentum> {
  static constexpr std::array<absl::string_view, 2> kNames = {"constant", "compensate"};
};
template <>
struct EnumSpellings<AuxNetArch> {
  static constexpr std::array<absl::string_view, 2> kNames = {"resnet", "conv"};
};
template <>
struct EnumSpellings<BnStatistics> {
  static constexpr std::array<absl::string_view, 2> kNames = {"local", "serial"};
};
template <>
struct EnumSpellings<AuxUpdate> {
  static constexpr std::array<absl::string_view, 2> kNames = {"distill", "direct"};
};
template <>
struct EnumSpellings<AuxPenalty> {
  static constexpr std::array<absl::string_view, 2> kNames = {"mse", "relative"};
};
template <>
struct EnumSpellings<ModelKind> {
  static constexpr std::array<absl::string_view, 7> kNames = {
      "mlp", "resnet", "revnet", "emulated", "torchscript", "gpt", "reformer"};
};
template <>
struct EnumSpellings<ResNetStyle> {
  static constexpr std::array<absl::string_view, 2> kNames = {"cifar", "imagenet"};
};
template <>
struct EnumSpellings<DatasetKind> {
  static constexpr std::array<absl::string_view, 6> kNames = {
      "fashion_mnist", "cifar10", "cifar100", "synthetic", "fortunes", "text_file"};
};
template <>
struct EnumSpellings<TextSplit> {
  static constexpr std::array<absl::string_view, 2> kNames = {"validation", "test"};
};
template <>
struct EnumSpellings<Partition> {
  static constexpr std::array<absl::string_view, 4> kNames = {"balanced", "even", "auto",
                                                              "explicit"};
};
template <>
struct EnumSpellings<BlockModes> {
  static constexpr std::array<absl::string_view, 3> kNames = {"auto", "store", "rebuild"};
};
template <>
struct EnumSpellings<BlockMode> {
  static constexpr std::array<absl::string_view, 2> kNames = {"store", "rebuild"};
};
template <>
struct EnumSpellings<Compression> {
  static constexpr std::array<absl::string_view, 6> kNames = {"none", "fp16", "bf16",
                                                              "int8", "int4", "auto"};
};
template <>
struct EnumSpellings<OptimizerKind> {
  static constexpr std::array<absl::string_view, 3> kNames = {"sgd", "adam", "muon"};
};
template <>
struct EnumSpellings<OuterOptimizer> {
  static constexpr std::array<absl::string_view, 2> kNames = {"sgd", "nesterov"};
};
template <>
struct EnumSpellings<LrScheduleKind> {
  static constexpr std::array<absl::string_view, 3> kNames = {"constant", "multistep", "cosine"};
};

// How `value` is written in a job spec.
// A value outside the enum (a cast from bad data) reads "?".
template <typename E>
constexpr absl::string_view NameOf(E value) {
  const auto& names = EnumSpellings<E>::kNames;
  const size_t i = static_cast<size_t>(value);
  return i < names.size() ? names[i] : absl::string_view("?");
}

// The value spelt `text`, if any.
template <typename E>
std::optional<E> EnumFromName(absl::string_view text) {
  const auto& names = EnumSpellings<E>::kNames;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return static_cast<E>(i);
  }
  return std::nullopt;
}

// Every spelling, in enum order (for "must be one of ..." and the docs).
template <typename E>
std::vector<std::string> EnumNames() {
  const auto& names = EnumSpellings<E>::kNames;
  return std::vector<std::string>(names.begin(), names.end());
}

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_SPEC_ENUMS_H_
