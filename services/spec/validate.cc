// The checks of a built JobSpec that one key's type cannot express: ranges,
// and rules across keys (nesterov needs momentum, nwise n <= stages.count,
// ...). ParseJobSpec runs them; each error names the key it is about.
#include "services/spec/validate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/spec/fields.h"
#include "services/spec/job_spec.h"
#include "services/spec/text.h"

namespace stagewise {
namespace {

using spec::FormatDouble;
using spec::InPhase;
using spec::KeyError;

// Job and phase names are stored and listed with every job.
constexpr size_t kMaxNameLength = 128;
// Synthetic data (docs/job_spec.md, data): at most ten million samples and
// 1 GiB (a byte per pixel, 8 per label) per split, each dimension at most
// 4096, at most a million classes.
constexpr int64_t kMaxSyntheticSamples = 10'000'000;
constexpr int64_t kMaxSyntheticBytes = int64_t{1} << 30;
constexpr int64_t kMaxSyntheticDim = 4096;
constexpr int kMaxClasses = 1'000'000;

// ---------------------------------------------------------------------------
// Semantic validation of a built spec.

absl::Status AtLeast(absl::string_view path, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return KeyError(path, absl::StrCat("must be >= ", min, ", got ", value));
}

absl::Status Positive(absl::string_view path, double value) {
  if (value > 0) return absl::OkStatus();
  return KeyError(path, absl::StrCat("must be > 0, got ", FormatDouble(value)));
}

// [0, 1): momentum and Adam's betas; 1 would never forget a gradient.
absl::Status InUnitInterval(absl::string_view path, double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return KeyError(path, absl::StrCat("must be in [0, 1), got ", FormatDouble(value)));
}

// Runs checks in order and keeps the first failure.
class Checker {
 public:
  Checker& operator()(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
    return *this;
  }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// What is wrong with a name ValidName refuses (long ones are not echoed).
std::string NameProblem(absl::string_view name) {
  if (name.size() > kMaxNameLength) {
    return absl::StrCat("at most ", kMaxNameLength, " characters, got ", name.size());
  }
  return absl::StrCat("must match [A-Za-z0-9_.-]+, got '", name, "'");
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidDevice(absl::string_view device) {
  if (device == "cpu" || device == "cuda") return true;
  constexpr absl::string_view kCuda = "cuda:";
  if (device.substr(0, kCuda.size()) != kCuda) return false;
  const absl::string_view index = device.substr(kCuda.size());
  int value = 0;
  return !index.empty() &&
         std::all_of(index.begin(), index.end(), [](char c) { return absl::ascii_isdigit(c); }) &&
         absl::SimpleAtoi(index, &value);
}

absl::Status ValidateModel(const ModelSpec& model) {
  if (model.name == ModelKind::kTorchScript) {
    if (model.path.empty()) {
      return KeyError("model.path", "required for model.name torchscript: the TorchScript file");
    }
    if (!std::isfinite(model.inverse_tolerance) || model.inverse_tolerance <= 0 ||
        model.inverse_tolerance > 1) {
      return KeyError("model.inverse_tolerance",
                      absl::StrCat("must be in (0, 1], got ", model.inverse_tolerance));
    }
    if (model.script_bytes < 0) return KeyError("script_model.bytes", "must be >= 0");
    return absl::OkStatus();
  }
  if (!model.path.empty()) {
    return KeyError("model.path", "only for model.name torchscript");
  }
  if (!model.script_blocks.empty()) {
    return KeyError("script_model", "only for model.name torchscript");
  }
  if (IsTextModel(model.name)) return spec::ValidateTextModel(model);
  if (model.name == ModelKind::kEmulated) {
    // An hour per block and mini-batch is far beyond any benchmark; the cap
    // keeps the waits representable.
    constexpr double kMaxMs = 3.6e6;
    constexpr int kMaxBlocks = 4096;
    Checker check;
    check(AtLeast("model.depth", int64_t{model.depth}, int64_t{1}));
    if (model.depth > kMaxBlocks) {
      check(KeyError("model.depth",
                     absl::StrCat("at most ", kMaxBlocks, " emulated blocks, got ", model.depth)));
    }
    auto time = [&](const std::string& key, double value) {
      if (!std::isfinite(value) || value < 0 || value > kMaxMs) {
        check(KeyError(
            key, absl::StrCat("must be a time in milliseconds in [0, ", kMaxMs, "], got ", value)));
      }
    };
    time("model.forward_ms", model.forward_ms);
    time("model.backward_ms", model.backward_ms);
    for (const auto& [key, list] : {std::pair<const char*, const std::vector<double>*>{
                                        "model.block_forward_ms", &model.block_forward_ms},
                                    {"model.block_backward_ms", &model.block_backward_ms}}) {
      if (list->empty()) continue;
      if (static_cast<int>(list->size()) != model.depth) {
        check(KeyError(key, absl::StrCat("needs one entry per block (model.depth ", model.depth,
                                         "), got ", list->size())));
        continue;
      }
      for (size_t i = 0; i < list->size(); ++i) time(absl::StrCat(key, "[", i, "]"), (*list)[i]);
    }
    check(InUnitInterval("model.backward_weight_share", model.backward_weight_share));
    return check.status();
  }
  Checker check;
  if (!check.status().ok() || model.name == ModelKind::kMlp) return check.status();

  const bool cifar_resnet = model.name == ModelKind::kResNet && model.style == ResNetStyle::kCifar;
  const std::string kind = model.name == ModelKind::kRevNet
                               ? "revnet"
                               : absl::StrCat("resnet (", NameOf(model.style), " style)");
  if (!model.blocks.empty()) {
    const size_t groups = cifar_resnet ? 3 : 4;
    if (model.blocks.size() != groups) {
      return KeyError("model.blocks",
                      absl::StrCat(kind, " needs ", groups, " entries (blocks per group), got ",
                                   model.blocks.size()));
    }
    return absl::OkStatus();  // blocks override depth
  }
  if (cifar_resnet) {
    // He et al. 2016, sec. 4.2: 3 groups of n basic blocks, 6n + 2 layers.
    if (model.depth < 8 || (model.depth - 2) % 6 != 0) {
      return KeyError(
          "model.depth",
          absl::StrCat("resnet depth must be 6n+2 with n >= 1 (20, 32, 56, 110, ...), got ",
                       model.depth));
    }
    return absl::OkStatus();
  }
  if (model.depth != 18 && model.depth != 34 && model.depth != 50) {
    return KeyError("model.depth",
                    absl::StrCat(kind, " depth must be 18, 34 or 50 (or give model.blocks), got ",
                                 model.depth));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const DataSpec& data) {
  if (IsText(data.dataset)) return spec::ValidateTextData(data);
  ModelSpec scratch;
  absl::Status status = FillDataShape(data, &scratch);
  if (!status.ok()) return status;
  if ((data.dataset == DatasetKind::kCifar10 || data.dataset == DatasetKind::kCifar100) &&
      data.path.empty()) {
    return KeyError("data.path", absl::StrCat("required for ", NameOf(data.dataset),
                                              " (the directory with the binary batches)"));
  }
  Checker check;
  if (data.dataset == DatasetKind::kSynthetic) {
    check(AtLeast("data.train_size", data.train_size, int64_t{1}));
    check(AtLeast("data.test_size", data.test_size, int64_t{1}));
    // A worker generates the split into memory (a byte per pixel and an
    // int64 label per sample): a spec must not be able to ask it for more
    // than the documented caps.
    double pixels = 1;
    for (int64_t d : data.shape) pixels *= static_cast<double>(d);
    for (const auto& [key, n] :
         {std::pair<const char*, int64_t>{"data.train_size", data.train_size},
          {"data.test_size", data.test_size}}) {
      const double bytes = (pixels + 8) * static_cast<double>(n);
      if (n > kMaxSyntheticSamples) {
        check(KeyError(key, absl::StrCat("must be <= ", kMaxSyntheticSamples, ", got ", n)));
      } else if (bytes > static_cast<double>(kMaxSyntheticBytes)) {
        check(KeyError(key, absl::StrCat(n, " samples of [", absl::StrJoin(data.shape, ", "),
                                         "] take ", FormatDouble(bytes / (1 << 20)),
                                         " MiB; synthetic data is limited to ",
                                         kMaxSyntheticBytes >> 20, " MiB per split")));
      }
    }
  }
  return check.status();
}

absl::Status ValidateStages(const StagesSpec& stages) {
  if (stages.count < 1) {
    return KeyError("stages.count", absl::StrCat("must be >= 1, got ", stages.count));
  }
  if (stages.replicas < 1 || stages.replicas > kMaxReplicas) {
    return KeyError("stages.replicas",
                    absl::StrCat("must be in [1, ", kMaxReplicas, "], got ", stages.replicas));
  }
  if (stages.chunks_per_worker < 1 || stages.chunks_per_worker > kMaxChunksPerWorker) {
    return KeyError("stages.chunks_per_worker", absl::StrCat("must be in [1, ", kMaxChunksPerWorker,
                                                             "], got ", stages.chunks_per_worker));
  }
  if (stages.partition != Partition::kExplicit) {
    if (!stages.ranges.empty()) {
      return KeyError("stages.partition", absl::StrCat("is '", NameOf(stages.partition),
                                                       "' but explicit ranges are given"));
    }
    return absl::OkStatus();
  }
  if (stages.ranges.empty()) {
    return KeyError("stages.partition", "needs at least one [begin, end) range");
  }
  if (stages.ranges.size() != static_cast<size_t>(VirtualStages(stages))) {
    return KeyError(
        "stages.count",
        absl::StrCat(stages.count,
                     stages.chunks_per_worker > 1
                         ? absl::StrCat(" x ", stages.chunks_per_worker, " chunks")
                         : "",
                     " does not match the ", stages.ranges.size(), " ranges in stages.partition"));
  }
  // The end of the last range must equal the model's block count, which only
  // the model library knows; it checks that when it builds the stages.
  int expected_begin = 0;
  for (size_t i = 0; i < stages.ranges.size(); ++i) {
    const auto [begin, end] = stages.ranges[i];
    const std::string path = absl::StrCat("stages.partition[", i, "]");
    const std::string shown = absl::StrCat("[", begin, ", ", end, "]");
    if (begin != expected_begin) {
      return KeyError(path, i == 0 ? absl::StrCat("must start at block 0, got ", shown)
                                   : absl::StrCat("must start where the previous range ends (",
                                                  expected_begin, "), got ", shown));
    }
    if (end <= begin) {
      return KeyError(path, absl::StrCat("must be non-empty (end > begin), got ", shown));
    }
    expected_begin = end;
  }
  return absl::OkStatus();
}

// A micro-batch needs at least one sample (of a replica's share of the batch).
absl::Status CheckMicroBatches(int micro_batches, const JobSpec& spec) {
  const int64_t share = spec.batch_size / std::max(1, spec.stages.replicas);
  if (micro_batches > share && share >= 1) {
    return KeyError("algorithm.micro_batches",
                    spec.stages.replicas > 1
                        ? absl::StrCat("must be <= batch_size / stages.replicas (", share,
                                       "), got ", micro_batches)
                        : absl::StrCat("must be <= batch_size (", share, "), got ", micro_batches));
  }
  return absl::OkStatus();
}

// delayed's and petra's momentum_by_delay: compensate lowers SGD's momentum
// or Adam's beta1. `optimizer`: the one the algorithm steps with (the job's,
// or a phase's).
absl::Status CheckMomentumByDelay(DelayMomentum momentum, const OptimizerSpec& optimizer) {
  if (momentum == DelayMomentum::kCompensate && optimizer.name != OptimizerKind::kSgd &&
      optimizer.name != OptimizerKind::kAdam) {
    return KeyError("algorithm.momentum_by_delay",
                    absl::StrCat("compensate applies to optimizer.name sgd or adam, not ",
                                 NameOf(optimizer.name)));
  }
  return absl::OkStatus();
}

// Each replica takes batch_size / R samples of every mini-batch, so that J x R
// workers see exactly the samples of J workers at the same batch_size.
absl::Status ValidateReplicas(const JobSpec& spec) {
  const int R = spec.stages.replicas;
  if (R <= 1) return absl::OkStatus();
  if (spec.batch_size % R != 0) {
    return KeyError("stages.replicas",
                    absl::StrCat(R, " does not divide batch_size ", spec.batch_size,
                                 ": every replica takes batch_size / replicas samples of each "
                                 "mini-batch"));
  }
  if (spec.algorithm.get_if<AuxNetOptions>() != nullptr && spec.sync.every > 1) {
    return KeyError("sync.every",
                    absl::StrCat("is ", spec.sync.every,
                                 "; auxnet averages every step (its auxiliary networks step "
                                 "apart from the stage's optimizer, outside the outer "
                                 "synchronisation): use sync.every: 1"));
  }
  return absl::OkStatus();
}

// The parameters' own ranges are checked when they are parsed (fields.cc);
// these are the rules that involve other keys. `optimizer` is the one the
// algorithm steps with: the job's, or its phase's.
absl::Status ValidateAlgorithm(const AlgorithmSpec& algorithm, const OptimizerSpec& optimizer,
                               const JobSpec& spec) {
  if (const auto* nwise = algorithm.get_if<NwiseOptions>()) {
    if (nwise->n > spec.stages.count) {
      return KeyError("algorithm.n", absl::StrCat("must be <= stages.count (", spec.stages.count,
                                                  "), got ", nwise->n));
    }
    auto head = ParseAuxHeadSpec(nwise->aux_head);
    if (!head.ok()) return head.status();
    return CheckMicroBatches(nwise->micro_batches, spec);
  }
  if (const auto* backprop = algorithm.get_if<BackpropOptions>()) {
    return CheckMicroBatches(backprop->micro_batches, spec);
  }
  if (const auto* delayed = algorithm.get_if<DelayedOptions>()) {
    if (delayed->predict_weights && delayed->weights != DelayedWeights::kStash) {
      return KeyError("algorithm.predict_weights",
                      "needs algorithm.weights: stash (the gradient is taken at the predicted "
                      "weights the forward used)");
    }
    if (delayed->forward == DelayedForward::kOnce && delayed->weights != DelayedWeights::kStash) {
      return KeyError("algorithm.forward",
                      "once needs algorithm.weights: stash (a kept graph holds the weights its "
                      "forward used); use forward: recompute with weights: current");
    }
    return CheckMomentumByDelay(delayed->momentum_by_delay, optimizer);
  }
  if (const auto* petra = algorithm.get_if<PetraOptions>()) {
    return CheckMomentumByDelay(petra->momentum_by_delay, optimizer);
  }
  if (const auto* auxnet = algorithm.get_if<AuxNetOptions>()) {
    // auxnet's running statistics from the serial forward need one.
    if (auxnet->bn_statistics == BnStatistics::kSerial && auxnet->serial_loss_every == 0) {
      return KeyError("algorithm.bn_statistics",
                      "serial needs the serial forward: set algorithm.serial_loss_every >= 1");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const OptimizerSpec& opt) {
  if (absl::Status s = spec::CheckRanges(spec::OptimizerFields(), "optimizer", opt); !s.ok()) {
    return s;
  }
  if (opt.name != OptimizerKind::kAdam && opt.nesterov && opt.momentum <= 0) {
    return KeyError("optimizer.nesterov", "requires optimizer.momentum > 0, got momentum 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateSchedule(const ScheduleSpec& schedule) {
  Checker check;
  check(spec::CheckRanges(spec::ScheduleFields(), "schedule", schedule));
  for (size_t i = 0; i < schedule.milestones.size(); ++i) {
    const std::string path = absl::StrCat("schedule.milestones[", i, "]");
    const double value = schedule.milestones[i];
    if (i == 0) {
      check(Positive(path, value));
    } else if (value <= schedule.milestones[i - 1]) {
      check(KeyError(path, absl::StrCat("milestones must be increasing: got ", FormatDouble(value),
                                        " after ", FormatDouble(schedule.milestones[i - 1]))));
    }
  }
  if (schedule.name == LrScheduleKind::kMultistep && schedule.milestones.empty()) {
    check(KeyError("schedule.milestones", "multistep needs at least one milestone"));
  }
  return check.status();
}

absl::Status ValidateLength(const JobSpec& spec) {
  // Their ranges (fields.cc, checked with the top level's) are far past any
  // real run, so step arithmetic never overflows.
  if (spec.epochs > 0 && spec.steps > 0) {
    return KeyError("epochs", absl::StrCat("set exactly one of epochs and steps, got epochs ",
                                           FormatDouble(spec.epochs), " and steps ", spec.steps));
  }
  if (spec.epochs == 0 && spec.steps == 0) {
    return KeyError("epochs", "one of epochs or steps must be > 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const CheckpointSpec& checkpoint) {
  Checker check;
  check(spec::CheckRanges(spec::CheckpointFields(), "checkpoint", checkpoint));
  if (checkpoint.dir.empty()) {
    if (checkpoint.every_epochs > 0) {
      check(KeyError("checkpoint.every_epochs", "requires checkpoint.dir"));
    }
    if (checkpoint.every_steps > 0) {
      check(KeyError("checkpoint.every_steps", "requires checkpoint.dir"));
    }
  }
  return check.status();
}

absl::Status ValidateSync(const SyncSpec& sync, int replicas) {
  if (absl::Status s = spec::CheckRanges(spec::SyncFields(), "sync", sync); !s.ok()) return s;
  Checker check;
  if (sync.every > 1 && replicas < 2) {
    check(KeyError("sync.every", absl::StrCat("is ", sync.every,
                                              ": needs stages.replicas > 1 (there is no other "
                                              "replica to synchronise with)")));
  }
  if (sync.outer == OuterOptimizer::kNesterov && sync.momentum == 0) {
    check(KeyError("sync.momentum", "outer: nesterov needs momentum > 0 (or outer: sgd)"));
  }
  return check.status();
}

absl::Status ValidateRecovery(const RecoverySpec& recovery) {
  return spec::CheckRanges(spec::RecoveryFields(), "recovery", recovery);
}

}  // namespace

absl::Status FillDataShape(const DataSpec& data, ModelSpec* model) {
  if (model == nullptr) {
    return absl::InvalidArgumentError("FillDataShape: model is null");
  }
  switch (data.dataset) {
    case DatasetKind::kFashionMnist:
      model->input_shape = {1, 28, 28};
      model->num_classes = 10;
      return absl::OkStatus();
    case DatasetKind::kCifar10:
    case DatasetKind::kCifar100:
      model->input_shape = {3, 32, 32};
      model->num_classes = data.dataset == DatasetKind::kCifar10 ? 10 : 100;
      return absl::OkStatus();
    case DatasetKind::kFortunes:
    case DatasetKind::kTextFile:
      // Bytes: a sequence of sequence_length values, 256 classes per target.
      model->input_shape = {data.sequence_length};
      model->num_classes = 256;
      return absl::OkStatus();
    case DatasetKind::kSynthetic:
      break;
  }
  if (data.shape.size() != 3) {
    return KeyError("data.shape",
                    absl::StrCat("must have 3 entries [C, H, W], got ", data.shape.size()));
  }
  for (size_t i = 0; i < data.shape.size(); ++i) {
    absl::Status status = AtLeast(absl::StrCat("data.shape[", i, "]"), data.shape[i], 1);
    if (!status.ok()) return status;
    if (data.shape[i] > kMaxSyntheticDim) {
      return KeyError(absl::StrCat("data.shape[", i, "]"),
                      absl::StrCat("must be <= ", kMaxSyntheticDim, ", got ", data.shape[i]));
    }
  }
  // One class would make the loss identically zero.
  absl::Status status = AtLeast("data.classes", int64_t{data.classes}, 2);
  if (!status.ok()) return status;
  if (data.classes > kMaxClasses) {
    return KeyError("data.classes",
                    absl::StrCat("must be <= ", kMaxClasses, ", got ", data.classes));
  }
  model->input_shape = data.shape;
  model->num_classes = data.classes;
  return absl::OkStatus();
}

absl::Status ValidatePhases(const JobSpec& spec) {
  bool by_epochs = false, by_steps = false;
  for (size_t i = 0; i < spec.phases.size(); ++i) {
    const PhaseSpec& phase = spec.phases[i];
    if (!ValidName(phase.name)) {
      return InPhase(i, KeyError("name", NameProblem(phase.name)));
    }
    if ((phase.epochs > 0) == (phase.steps > 0) || phase.epochs < 0 || phase.steps < 0) {
      return InPhase(i, KeyError("epochs", "set exactly one of epochs and steps, > 0"));
    }
    by_epochs |= phase.epochs > 0;
    by_steps |= phase.steps > 0;
    if (absl::Status s = ValidateAlgorithm(phase.algorithm, phase.optimizer, spec); !s.ok())
      return InPhase(i, s);
    const auto* backprop = phase.algorithm.get_if<BackpropOptions>();
    if (i > 0 && backprop != nullptr && !backprop->schedule.has_value()) {
      return InPhase(i, KeyError("algorithm.schedule",
                                 "auto is chosen by the planner for the first phase only; name "
                                 "gpipe, 1f1b or zb-h1"));
    }
    if (absl::Status s = ValidateOptimizer(phase.optimizer); !s.ok()) return InPhase(i, s);
    if (absl::Status s = ValidateSchedule(phase.schedule); !s.ok()) return InPhase(i, s);
  }
  if (by_epochs && by_steps) {
    return KeyError("phases", "give every phase's length in epochs, or every one in steps");
  }
  return absl::OkStatus();
}

// Interleaved 1F1B: stages.chunks_per_worker > 1 and schedule: interleaved go
// together, in every phase, on one pipeline cut by the spec.
// recovery.min_stages: a recovering job may resume on fewer stages, its
// checkpoint resharded; only plain pipelines (one replica, one chunk per
// worker) whose algorithms run on that few.
absl::Status ValidateMinStages(const JobSpec& spec) {
  const int min = spec.recovery.min_stages;
  if (min == 0) return absl::OkStatus();
  if (min < 0 || min > spec.stages.count) {
    return KeyError("recovery.min_stages", absl::StrCat("must be 0 (off) or 1..stages.count (",
                                                        spec.stages.count, "), got ", min));
  }
  if (spec.stages.replicas > 1) {
    return KeyError("recovery.min_stages",
                    "not with stages.replicas > 1 (recovery.elastic runs fewer replicas instead)");
  }
  if (spec.stages.chunks_per_worker > 1) {
    return KeyError("recovery.min_stages", "not with stages.chunks_per_worker > 1 yet");
  }
  for (const PhaseSpec& phase : Phases(spec)) {
    if (const auto* nwise = phase.algorithm.get_if<NwiseOptions>(); nwise && nwise->n > min) {
      return KeyError("recovery.min_stages",
                      absl::StrCat("nwise with n = ", nwise->n, " needs at least ", nwise->n,
                                   " stages, got ", min));
    }
  }
  return absl::OkStatus();
}

// recovery.replay: the stages keep what they send until a checkpoint
// commits; one pipeline of one chunk per worker.
absl::Status ValidateReplay(const JobSpec& spec) {
  if (!spec.recovery.replay) return absl::OkStatus();
  if (spec.checkpoint.dir.empty()) {
    return KeyError("recovery.replay",
                    "needs checkpoint.dir (the stages keep what they send until a checkpoint "
                    "commits)");
  }
  if (spec.stages.replicas > 1) {
    // A lost replica copies a survivor's live state: the replicas must be
    // equal at every step's start (docs/fault_tolerance.md).
    for (const PhaseSpec& phase : Phases(spec)) {
      if (std::get_if<BackpropOptions>(&phase.algorithm.options) == nullptr) {
        return KeyError("recovery.replay",
                        "with stages.replicas > 1 needs algorithm backprop (a decoupled "
                        "algorithm's in-flight state is each replica's own)");
      }
    }
    if (spec.sync.every > 1) {
      return KeyError("recovery.replay",
                      "with stages.replicas > 1 needs sync.every: 1 (replicas differ between "
                      "outer synchronisations)");
    }
    if (spec.sync.overlap) {
      return KeyError("recovery.replay", "with stages.replicas > 1: not with sync.overlap yet");
    }
    if (spec.transport.error_feedback) {
      return KeyError("recovery.replay",
                      "with stages.replicas > 1: not with transport.error_feedback (its "
                      "residuals are each replica's own)");
    }
  }
  if (spec.stages.chunks_per_worker > 1) {
    return KeyError("recovery.replay", "not with stages.chunks_per_worker > 1 yet");
  }
  return absl::OkStatus();
}

// stages.bottleneck: projections at the cuts of a partition known before
// the job is planned, of a model whose blocks stagewise builds.
absl::Status ValidateBottleneck(const JobSpec& spec) {
  const int64_t rank = spec.stages.bottleneck.rank;
  if (rank == 0) return absl::OkStatus();
  if (rank < 0 || rank > kMaxBottleneckRank) {
    return KeyError("stages.bottleneck.rank",
                    absl::StrCat("must be in [1, ", kMaxBottleneckRank, "], got ", rank));
  }
  if (VirtualStages(spec.stages) < 2) {
    return KeyError("stages.bottleneck",
                    "sits at the cuts between stages: needs at least 2 stages");
  }
  if (spec.stages.partition == Partition::kAuto) {
    return KeyError("stages.bottleneck",
                    "is part of the model, so its cuts must be known before the job is planned: "
                    "use stages.partition balanced, even or explicit ranges, not auto");
  }
  if (spec.model.name == ModelKind::kTorchScript) {
    return KeyError("stages.bottleneck",
                    "a TorchScript model's blocks come from its file: put the projections into "
                    "the model itself (docs/models.md, \"Bottlenecks at the cuts\")");
  }
  return absl::OkStatus();
}

// int8 or int4, or auto (which may pick them).
bool Quantized(Compression c) {
  return c == Compression::kInt8 || c == Compression::kInt4 || c == Compression::kAuto;
}

// transport: blocks of a power of two, and the keys that need a format to act on.
absl::Status ValidateTransport(const TransportSpec& t, double link_gbps) {
  struct Direction {
    const char* section;
    const WireFormatSpec* format;
  };
  if (absl::Status s = spec::CheckRanges(spec::TransportFields(), "transport", t); !s.ok()) {
    return s;
  }
  const Direction directions[] = {{"transport.forward", &t.forward},
                                  {"transport.backward", &t.backward}};
  for (const Direction& d : directions) {
    if (absl::Status s = spec::CheckRanges(spec::WireFormatFields(), d.section, *d.format);
        !s.ok()) {
      return s;
    }
  }
  const std::pair<std::string, int> blocks[] = {{"transport.block", t.block},
                                                {"transport.forward.block", t.forward.block},
                                                {"transport.backward.block", t.backward.block}};
  for (const auto& [path, block] : blocks) {
    if ((block & (block - 1)) != 0) {
      return KeyError(path,
                      absl::StrCat("must be a power of two (16, 32, ..., 4096), got ", block));
    }
  }
  for (const Direction& d : directions) {
    if (d.format->compression == Compression::kAuto && link_gbps <= 0) {
      // Named where it was written: the top-level key sets both directions.
      return KeyError(t.compression == Compression::kAuto ? std::string("transport.compression")
                                                          : absl::StrCat(d.section, ".compression"),
                      "auto picks a format for the links' speed: set placement.link_gbps (the "
                      "slowest link between neighbouring stages, in Gbit/s)");
    }
  }
  if (t.rotate && !Quantized(t.forward.compression) && !Quantized(t.backward.compression)) {
    return KeyError("transport.rotate",
                    "rotates blocks of int8 or int4 values, and neither direction uses them");
  }
  if (t.error_feedback && t.backward.compression == Compression::kNone) {
    return KeyError("transport.error_feedback",
                    "needs a lossy format for gradients (transport.compression or "
                    "transport.backward.compression), got none");
  }
  return absl::OkStatus();
}

// rebalance: re-plans on the workers' measured speeds, so the job must be
// planned on per-worker profiles and keep checkpoints to move through.
absl::Status ValidateRebalance(const JobSpec& spec) {
  const RebalanceSpec& r = spec.rebalance;
  if (absl::Status s = spec::CheckRanges(spec::RebalanceFields(), "rebalance", r); !s.ok()) {
    return s;
  }
  if (r.threshold == 0) return absl::OkStatus();
  if (!spec.placement.per_worker_profiles) {
    return KeyError("rebalance.threshold",
                    "re-plans on each worker's profile: needs placement.per_worker_profiles "
                    "(and stages.partition: auto)");
  }
  if (spec.checkpoint.dir.empty()) {
    return KeyError("rebalance.threshold",
                    "moves the job through a checkpoint: needs checkpoint.dir");
  }
  if (spec.stages.replicas > 1 || spec.stages.chunks_per_worker > 1) {
    return KeyError("rebalance.threshold",
                    "not with stages.replicas > 1 or stages.chunks_per_worker > 1 yet");
  }
  return absl::OkStatus();
}

absl::Status ValidateInterleaved(const JobSpec& spec) {
  const int v = spec.stages.chunks_per_worker, J = spec.stages.count;
  const std::vector<PhaseSpec> phases = Phases(spec);
  for (size_t i = 0; i < phases.size(); ++i) {
    const auto* backprop = phases[i].algorithm.get_if<BackpropOptions>();
    const bool interleaved =
        backprop != nullptr && backprop->schedule == PipelineSchedule::kInterleaved;
    auto in_phase = [&](absl::Status s) { return spec.phases.empty() ? s : InPhase(i, s); };
    if (interleaved && v < 2) {
      return in_phase(KeyError("algorithm.schedule",
                               "interleaved needs stages.chunks_per_worker >= 2 (the chunks of "
                               "blocks each worker holds)"));
    }
    if (!interleaved && v > 1) {
      return KeyError(
          "stages.chunks_per_worker",
          absl::StrCat("is ", v,
                       ", which only algorithm: {name: backprop, schedule: "
                       "interleaved} runs",
                       spec.phases.empty() ? "" : absl::StrCat(" (phase ", i, " is not)")));
    }
    if (interleaved && backprop->micro_batches % J != 0) {
      return in_phase(KeyError("algorithm.micro_batches",
                               absl::StrCat("interleaved needs a multiple of stages.count (", J,
                                            "), got ", backprop->micro_batches,
                                            ": micro-batches enter the ring in groups of ", J)));
    }
  }
  if (v > 1 && spec.stages.replicas > 1) {
    return KeyError("stages.replicas",
                    "is not supported with stages.chunks_per_worker > 1 yet (one pipeline)");
  }
  if (v > 1 && spec.stages.memory_budget > 0) {
    return KeyError("stages.memory_budget",
                    "the planner plans one chunk per worker; with chunks_per_worker leave it out "
                    "(and the workers' --memory-bytes do not apply)");
  }
  if (v > 1 && spec.stages.partition == Partition::kAuto) {
    return KeyError("stages.partition",
                    "auto plans one chunk per worker; with chunks_per_worker use balanced, even "
                    "or explicit ranges");
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const JobSpec& spec) { return spec::ValidateParsed(spec, {}); }

namespace spec {

// "required (one of a, b, c)" for a required closed-set key.
template <typename E>
absl::Status Required(const char* key) {
  return KeyError(key, absl::StrCat("required (one of ", absl::StrJoin(EnumNames<E>(), ", "), ")"));
}

absl::Status ValidateParsed(const JobSpec& spec, const MissingKeys& missing) {
  if (spec.name.empty()) {
    return KeyError("name", "required (letters, digits, '_', '.', '-')");
  }
  if (!ValidName(spec.name)) {
    return KeyError("name", NameProblem(spec.name));
  }
  Checker check;
  check(CheckRanges(TopLevelFields(), "", spec));
  if (!ValidDevice(spec.device)) {
    check(KeyError("device", absl::StrCat("must be cpu, cuda or cuda:N, got '", spec.device, "'")));
  }
  check(missing.model_name ? Required<ModelKind>("model.name") : ValidateModel(spec.model));
  check(CheckRanges(ModelFields(), "model", spec.model));
  check(missing.data_dataset ? Required<DatasetKind>("data.dataset") : ValidateData(spec.data));
  check(CheckRanges(DataFields(), "data", spec.data));
  if (check.status().ok()) check(ValidateModelFitsData(spec));
  check(ValidateStages(spec.stages));
  if (check.status().ok()) check(ValidateReplicas(spec));
  if (check.status().ok()) check(ValidateAlgorithm(spec.algorithm, spec.optimizer, spec));
  if (check.status().ok()) check(ValidatePhases(spec));
  if (check.status().ok() && spec.stages.modes != BlockModes::kAuto) {
    // Only these algorithms run reversible blocks in a chosen mode.
    for (const PhaseSpec& phase : Phases(spec)) {
      const AlgorithmKind kind = phase.algorithm.kind();
      if (kind != AlgorithmKind::kBackprop && kind != AlgorithmKind::kPetra) {
        check(KeyError("stages.modes", absl::StrCat("'", NameOf(spec.stages.modes),
                                                    "' applies to backprop and petra, not to '",
                                                    NameOf(kind), "' (leave it auto)")));
        break;
      }
      const auto* backprop = phase.algorithm.get_if<BackpropOptions>();
      if (backprop != nullptr && backprop->schedule == PipelineSchedule::kZbH1 &&
          spec.stages.modes == BlockModes::kRebuild) {
        check(KeyError("stages.modes",
                       "rebuild keeps no graph between a backward's input and weight gradients, "
                       "which algorithm.schedule zb-h1 splits (use store or auto)"));
        break;
      }
    }
  }
  check(ValidateOptimizer(spec.optimizer));
  check(ValidateSchedule(spec.schedule));
  check(ValidateLength(spec));
  check(CheckRanges(EvalFields(), "eval", spec.eval));
  check(ValidateCheckpoint(spec.checkpoint));
  check(ValidateRecovery(spec.recovery));
  check(ValidateSync(spec.sync, spec.stages.replicas));
  if (check.status().ok()) check(ValidateInterleaved(spec));
  if (check.status().ok()) check(ValidateMinStages(spec));
  check(ValidateReplay(spec));
  if (check.status().ok()) check(ValidateRebalance(spec));
  check(ValidateTransport(spec.transport, spec.placement.link_gbps));
  check(ValidateBottleneck(spec));
  if (spec.placement.labels.size() > 32) {
    check(KeyError("placement.labels", "at most 32 labels (a worker registers at most 32)"));
  }
  for (size_t i = 0; i < spec.placement.labels.size(); ++i) {
    const std::string& label = spec.placement.labels[i];
    const size_t eq = label.find('=');
    if (eq == 0 || eq == std::string::npos || label.size() > 321) {
      check(KeyError(
          absl::StrCat("placement.labels[", i, "]"),
          absl::StrCat("must be key=value with a non-empty key, got '", label.substr(0, 64), "'")));
    }
  }
  check(CheckRanges(PlacementFields(), "placement", spec.placement));
  if (spec.placement.per_worker_profiles && spec.stages.partition != Partition::kAuto) {
    check(KeyError("placement.per_worker_profiles",
                   "plans the partition on every worker's profile: needs stages.partition: auto"));
  }
  return check.status();
}

}  // namespace spec

}  // namespace stagewise
