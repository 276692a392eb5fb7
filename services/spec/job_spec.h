// Job specification: the YAML a user submits, parsed once into typed values
// and validated. No LibTorch here: the coordinator and CLI parse specs
// without it. Every process parses the text once (ParseJobSpec) and passes
// `const JobSpec&` on.
//
// The library (services/spec/):
//   enums.h        the closed sets and their spellings
//   job_spec.h     the typed spec (this file) and its entry points
//   fields.h       each key declared once: name, type, default, range, doc;
//                  the parser, the "did you mean" and docs/job_spec.md's
//                  tables come from it
//   yaml_reader.h  YAML nodes to values, with errors that name the key path
//   parse.cc       the document to a JobSpec
//   validate.cc    ranges and cross-field rules on a built JobSpec
#ifndef STAGEWISE_SERVICES_SPEC_JOB_SPEC_H_
#define STAGEWISE_SERVICES_SPEC_JOB_SPEC_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "services/spec/enums.h"

namespace stagewise {

// model: which zoo network and its size knobs.
struct ModelSpec {
  ModelKind name = ModelKind::kMlp;         // required in YAML
  int depth = 0;                            // resnet: 20/32/56/110 (cifar) or 18/34/50;
                                            // revnet: 18/34/50; mlp: unused
  ResNetStyle style = ResNetStyle::kCifar;  // resnet only
  bool small_input = true;                  // imagenet/revnet: 3x3 stem, no max-pool
  int width = 0;                            // base channels (0 = the paper's default)
  std::vector<int> blocks;                  // per-stage block counts; overrides depth
  std::vector<int> hidden = {256};          // mlp: hidden layer sizes
  int heads = 4;                            // gpt/reformer: attention heads (divide width)
  // emulated only (docs/models.md, "Emulated accelerators"): depth blocks whose
  // forward and backward each take this long per mini-batch of batch_size
  // samples (scaled to the micro-batch), waiting instead of computing.
  double forward_ms = 1;
  double backward_ms = 2;
  // emulated: per-block times (one entry per block) instead of the two above,
  // e.g. a real job's profiled stage times (tests/bench/emulate_job.py).
  std::vector<double> block_forward_ms, block_backward_ms;
  bool reversible = true;  // emulated: reversible couplings (PETRA, rebuild)
  // torchscript only (docs/torchscript.md): the file, and how closely a
  // block's exported `inverse` must rebuild its input (max |x - x'| over a
  // random batch, relative to max |x|).
  std::string path;
  double inverse_tolerance = 1e-4;
  // What a dry run of the file found: the top-level `script_model` section,
  // which the CLI adds when it submits a torchscript job (the coordinator
  // partitions without LibTorch; every worker checks its file against it).
  struct ScriptBlock {
    std::vector<int64_t> in_shape, out_shape;  // per sample
    bool reversible = false;
    int64_t parameters = 0;
  };
  std::string script_file;   // absolute path the workers load
  int64_t script_bytes = 0;  // the file's size, checked by every worker
  std::vector<ScriptBlock> script_blocks;
  int64_t batch_size = 0;  // filled from the job's batch_size when parsing
  // Filled from the data section when parsing: [C, H, W] and class count
  // (text: [sequence_length] and 256 byte values).
  std::vector<int64_t> input_shape;
  int num_classes = 0;
  // emulated: the part of backward_ms that is weight gradients (the W a
  // zero-bubble schedule defers); the rest is the input gradient (B).
  double backward_weight_share = 0.5;
  // stages.bottleneck, filled when parsing with what places it (the stage
  // count and partition), so that the model's blocks follow from this
  // section alone (models::PlanModel): at every cut of that partition a
  // down-projection to `rank` channels ends one stage and the up-projection
  // back starts the next, so only `rank` channels cross. rank 0: none.
  struct Bottleneck {
    int64_t rank = 0;
    int stages = 1;  // virtual stages
    Partition partition = Partition::kBalanced;
    std::vector<std::pair<int, int>> ranges;  // explicit: the model's own block ranges
  };
  Bottleneck bottleneck;
};

// data: where samples come from and how they are augmented.
struct DataSpec {
  DatasetKind dataset = DatasetKind::kSynthetic;  // required in YAML
  std::string path;                               // directory; empty = the dataset's default
  bool augment = false;                           // random crop with padding + horizontal flip
  int crop_padding = 4;
  bool horizontal_flip = true;
  bool normalize = true;
  // synthetic only
  int64_t train_size = 4096;
  int64_t test_size = 1024;
  std::vector<int64_t> shape = {3, 32, 32};
  int classes = 10;
  // optional caps on the number of samples used (0 = all); handy for smoke runs.
  int64_t limit_train = 0;
  int64_t limit_test = 0;
  // text (fortunes, text_file; docs/text.md): bytes per training sequence;
  // with min_sequence_length > 0 every mini-batch draws its own length in
  // [min_sequence_length, sequence_length]. A training epoch is train_size
  // sequences at random offsets; the evaluation reads eval_split in order.
  int64_t sequence_length = 128;
  int64_t min_sequence_length = 0;
  TextSplit eval_split = TextSplit::kValidation;
};

// Whether the job's data is byte-level text (a language-modelling task).
inline bool IsText(DatasetKind d) {
  return d == DatasetKind::kFortunes || d == DatasetKind::kTextFile;
}
inline bool IsTextModel(ModelKind m) { return m == ModelKind::kGpt || m == ModelKind::kReformer; }

// algorithm: one options struct per algorithm (docs/algorithms.md says what
// each does; fields.cc declares each key's name, range and doc line once).
struct BackpropOptions {
  int micro_batches = 1;
  // Empty: `schedule: auto` (the planner picks; ResolveAutoSchedule).
  std::optional<PipelineSchedule> schedule = PipelineSchedule::kGpipe;
  bool recompute = false;  // keep only stage inputs, recompute in backward
  int lookahead = 0;       // 1F1B: extra micro-batches in flight per stage
};

// delayed's `max_in_flight: auto`.
inline constexpr int kAutoInFlight = -1;

struct DelayedOptions {
  DelayedWeights weights = DelayedWeights::kStash;
  // One forward per mini-batch (its graph kept until the gradient returns) or
  // a graph-free forward and a recomputation; auto: once with stash.
  DelayedForward forward = DelayedForward::kAuto;
  // `forward` resolved: true for once (and auto with stash).
  bool forward_once() const {
    return forward == DelayedForward::kOnce ||
           (forward == DelayedForward::kAuto && weights == DelayedWeights::kStash);
  }
  // Staleness corrections (docs/algorithms.md, delayed): the forward at the
  // weights extrapolated along the last update by the stage's delay (stash
  // only), and a learning rate scaled by the delay.
  bool predict_weights = false;
  DelayLr lr_by_delay = DelayLr::kConstant;
  DelayMomentum momentum_by_delay = DelayMomentum::kConstant;
  // 0 stands for the pipeline's natural depth at stage j, 2(J-1-j)+1
  // mini-batches (worker/algorithms/delayed.cc); n > 0 caps it at n;
  // kAutoInFlight (`auto`): each stage keeps the depth the plan chose to
  // cover the links' round trip (StageAssignment.max_in_flight).
  int max_in_flight = 0;
  // k: every stage steps once per k backward passes with their mean gradient
  // (bounded accumulation, as PACI).
  int accumulation = 1;
};

struct FeaturesReplayOptions {};

struct PetraOptions {
  int accumulation = 1;  // k: step every k backward passes
  bool verify_rebuild = false;
  // Staleness corrections, as delayed's (the forward at the extrapolated
  // weights, the learning rate and SGD momentum keyed to the stage's delay).
  bool predict_weights = false;
  DelayLr lr_by_delay = DelayLr::kConstant;
  DelayMomentum momentum_by_delay = DelayMomentum::kConstant;
};

struct NwiseOptions {
  int n = 2;
  bool mix_local = false;
  int micro_batches = 1;
  std::string aux_head = "conv";  // checked by ParseAuxHeadSpec when parsed
};

struct AuxNetOptions {
  double beta = 1.0e5;
  double beta_factor = 1.0;
  int beta_every_epochs = 0;
  double aux_lr = 0.1;
  AuxNetArch auxnet = AuxNetArch::kResnet;
  int auxnet_blocks = 1;
  int serial_loss_every = 10;
  double noise_std = 0.0;
  BnStatistics bn_statistics = BnStatistics::kLocal;
  AuxUpdate aux_update = AuxUpdate::kDistill;
  AuxPenalty penalty = AuxPenalty::kMse;
};

// The alternatives are in AlgorithmKind order (fields.cc checks it).
using AlgorithmOptions = std::variant<BackpropOptions, DelayedOptions, FeaturesReplayOptions,
                                      PetraOptions, NwiseOptions, AuxNetOptions>;

struct AlgorithmSpec {
  AlgorithmOptions options;  // default: backprop with its defaults

  AlgorithmKind kind() const { return static_cast<AlgorithmKind>(options.index()); }
  std::string name() const { return std::string(NameOf(kind())); }
  // This algorithm's options, or nullptr if it is another algorithm.
  template <typename Options>
  const Options* get_if() const {
    return std::get_if<Options>(&options);
  }
};

// An algorithm from its name and parameters as text (a hand-built spec, a
// command-line override): each value is type- and range-checked exactly as
// in a job file, missing ones take their defaults. Errors name the key, e.g.
// "algorithm.accumulation: must be >= 1, got 0".
absl::StatusOr<AlgorithmSpec> MakeAlgorithmSpec(
    const std::string& name, const std::map<std::string, std::string>& params = {});

// Every parameter of `spec` in canonical text ("0.1", "true", "1f1b"), keyed
// by its job-spec key: what MakeAlgorithmSpec reads back to the same spec.
std::map<std::string, std::string> AlgorithmParams(const AlgorithmSpec& spec);

// What nwise's `aux_head` says:
//   "conv"          the paper's head (Interlocking Backpropagation, App. B.2;
//                   docs/references.md): conv3x3(128)-BN-ReLU,
//                   conv3x3(64)-BN-ReLU, global average pool, linear
//   "conv:C1,C2,.." conv3x3-BN-ReLU layers of these widths, then pool and linear
//   "linear"        global average pool (images) or flatten, then linear
struct AuxHeadSpec {
  std::vector<int64_t> conv_channels;  // empty: linear
};
absl::StatusOr<AuxHeadSpec> ParseAuxHeadSpec(const std::string& text);

// Every algorithm name the job spec accepts, in schema order.
std::vector<std::string> KnownAlgorithms();

// k, the number of backward passes a stage accumulates before it steps
// (petra's and delayed's `accumulation`; 1 for every other algorithm).
int64_t AccumulationFactor(const AlgorithmSpec& spec);

// stages: how many stages and which global blocks each holds.
// The most replicas of a stage (stages.replicas).
constexpr int kMaxReplicas = 64;
// The most chunks per worker (stages.chunks_per_worker).
constexpr int kMaxChunksPerWorker = 16;
// stages.bottleneck.rank: channels that cross a cut, at most.
constexpr int64_t kMaxBottleneckRank = 65536;

struct StagesSpec {
  int count = 1;
  // Pipelines that train side by side on disjoint shares of every mini-batch
  // (data x pipeline parallelism, docs/replicas.md): J x R workers, each
  // stage's R replicas averaging their gradients before every step.
  int replicas = 1;
  // balanced: cut where the estimated work of the slowest stage is least
  // (models::EstimateBlockWork); even: the same block count per stage; auto:
  // profiled and planned by the coordinator; explicit: `ranges`.
  Partition partition = Partition::kBalanced;
  // explicit: [begin, end) global block ranges, contiguous and covering the model.
  std::vector<std::pair<int, int>> ranges;
  // Reversible blocks (Jiang et al., reversible training framework;
  // docs/planner.md): "auto" lets the planner choose per block
  // under memory_budget (without one, backprop stores and petra rebuilds);
  // "store" (compute-centric) or "rebuild" (memory-centric) for all of them.
  BlockModes modes = BlockModes::kAuto;
  // Memory cap per worker in bytes for the planner (0 = none; workers'
  // --memory-bytes applies then). Written as 2GiB, 512MiB, 1.5G or bytes.
  int64_t memory_budget = 0;
  // Interleaved 1F1B (algorithm.schedule: interleaved): each of the `count`
  // workers of a pipeline holds this many non-adjacent chunks of blocks, the
  // model being cut into count x chunks_per_worker virtual stages; worker j
  // holds virtual stages j, j + count, j + 2 count, ...
  int chunks_per_worker = 1;
  // A learned bottleneck at every cut (docs/models.md, "Bottlenecks at the
  // cuts"): `rank` channels cross between stages instead of the model's
  // width; 0: none. The blocks it adds are part of the model
  // (ModelSpec::bottleneck).
  struct Bottleneck {
    int64_t rank = 0;
  };
  Bottleneck bottleneck;
};

// The pipeline's stages as the model is cut: count x chunks_per_worker
// (count without interleaving).
inline int VirtualStages(const StagesSpec& stages) {
  return stages.count * std::max(1, stages.chunks_per_worker);
}

// "2GiB", "512MiB", "64KiB", "1.5G", "300MB", "1000" -> bytes;
// INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

struct OptimizerSpec {
  OptimizerKind name = OptimizerKind::kSgd;
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  bool exclude_bn_and_bias = true;  // no weight decay on BN parameters and biases
  double beta1 = 0.9;               // adam
  double beta2 = 0.999;             // adam
  double eps = 1e-8;                // adam
  // muon: the learning rate of the parameters Adam steps (rank < 2: biases,
  // norms); 0 = lr. The schedule scales both alike.
  double adam_lr = 0;
  int newton_schulz_steps = 5;     // muon
  bool scale_lr_by_batch = false;  // Goyal rule: lr * batch_size * k / 256
};

struct ScheduleSpec {
  LrScheduleKind name = LrScheduleKind::kConstant;
  double warmup_epochs = 0;        // linear warm-up from 0 (fractional allowed)
  std::vector<double> milestones;  // multistep: epochs at which lr *= gamma
  double gamma = 0.1;
  double min_lr = 0.0;  // cosine: final lr
};

struct EvalSpec {
  int every_epochs = 1;     // 0 = only at the end
  int64_t every_steps = 0;  // 0 = off
  bool at_end = true;
};

struct CheckpointSpec {
  std::string dir;  // empty = no checkpoints
  int every_epochs = 0;
  int64_t every_steps = 0;
  int keep = 3;
};

// What happens when a worker is lost or the coordinator restarts
// (docs/fault_tolerance.md): the job resumes from its newest committed
// checkpoint on the workers available.
struct RecoverySpec {
  int max_restarts = 3;       // recoveries before the job fails
  double wait_seconds = 300;  // how long a recovering job waits for workers
  bool from_scratch = true;   // without a committed checkpoint, restart from step 0
  // A running job whose step stops advancing for this long is treated as a
  // lost stage (cause "stalled"). 0: automatic, 20x the median step time
  // measured so far, at least 300 s (and 300 s before any step).
  double stall_seconds = 0;
  // Replicated stages (stages.replicas = R > 1, docs/replicas.md): a
  // recovering job short of J x R idle workers runs its next attempt with
  // fewer replicas of every stage (the most that are idle, dividing
  // batch_size) instead of waiting; the global batch, and so the learning
  // rate, stay as they are. The next recovery takes all R again if it can.
  bool elastic = false;
  // Resharding (docs/fault_tolerance.md, "Fewer stages"): a recovering job
  // still short of workers for all its stages after wait_seconds resumes on
  // fewer stages, at least this many (0: never), for as many as are idle:
  // its checkpoint is regrouped onto the new cut (balanced), exactly for
  // backprop. It grows back towards stages.count when workers are idle
  // again (a planned stop at the next step boundary).
  int min_stages = 0;
  // Replacing one stage (docs/fault_tolerance.md, "Replacing one stage"): a
  // lost worker's stage starts again on an idle worker inside the running
  // attempt, from its last committed shard, and replays the messages its
  // neighbours kept since; the other stages redo nothing. Falls back to a
  // rollback when no worker is idle or a second one is lost meanwhile.
  bool replay = false;
};

// How the replicas of a stage stay equal (stages.replicas > 1,
// docs/replicas.md). every = 1: they average their gradients before every
// optimizer step. every = H > 1 (the DiLoCo recipe): each replica steps on
// its own share for H optimizer steps, then the replicas average their
// parameter moves since the last synchronisation and an outer optimizer
// (SGD, or SGD with Nesterov momentum) applies the average to the parameters
// they started from; every replica continues from the result.
struct SyncSpec {
  int every = 1;
  OuterOptimizer outer = OuterOptimizer::kNesterov;
  double lr = 0.7;
  double momentum = 0.9;
  // every = 1, backprop: each bucket of gradients starts its all-reduce as
  // soon as the step's last backward has produced it, while the backward
  // goes on (docs/replicas.md, "Overlap"). Opt-in until a replica lost
  // mid-step can no longer hold its peers up to the collective timeout.
  bool overlap = false;
  // Gradients travel in flat buckets of at most this many MiB (a larger
  // tensor alone); with overlap, a bucket starts once all its gradients are.
  double bucket_mb = 25;
};

// Where the stages of a job may run (docs/security.md).
struct PlacementSpec {
  // No two stages on workers with the same certificate identity, so that one
  // certificate never holds a whole pipeline. Plaintext workers have none.
  bool distinct_identities = true;
  // A planned job (stages.partition: auto) is profiled on every worker it
  // was placed on, and each stage is planned on the times of the worker
  // that runs it: machines of different speeds get ranges of equal time
  // (docs/planner.md, "Heterogeneous workers").
  bool per_worker_profiles = false;
  // Only workers registered with every one of these labels ("key=value",
  // stagewise-worker --label), e.g. ["gpu=a100"].
  std::vector<std::string> labels;
  // The links between neighbouring workers, for the planner
  // (stages.partition: auto): Gbit/s and round trip in ms; 0: not modelled.
  // A stage's time then includes sending its output forward and its
  // input's gradient back, so the cut avoids large activations on slow links.
  double link_gbps = 0;
  double link_rtt_ms = 0;
};

// One phase of a job that switches algorithm and hyper-parameters part-way
// (interlocking backprop's FINE-TUNING: n = 1 for T1 epochs, then backprop
// with a new learning rate and a reset optimizer).
struct PhaseSpec {
  std::string name;
  double epochs = 0;  // exactly one of epochs / steps is > 0, the same one in every phase
  int64_t steps = 0;
  AlgorithmSpec algorithm;
  OptimizerSpec optimizer;      // the job's, with this phase's keys on top
  ScheduleSpec schedule;        // likewise; it runs over this phase's steps
  bool reset_optimizer = true;  // fresh optimizer state at the start of the phase
};

// How float32 tensors travel in one direction between stages.
struct WireFormatSpec {
  // "none" (exact), "fp16" or "bf16" (half the bytes; the receiver widens
  // them back to float32), "int8" or "int4" (block-wise quantized).
  Compression compression = Compression::kNone;
  int block = 64;       // int8/int4: values per scale, a power of two
  bool rotate = false;  // int8/int4: random Hadamard rotation of each block first
};

// How stage-to-stage messages travel (docs/job_spec.md, "transport"). The
// top-level compression, block and rotate apply to both directions; the
// forward (activations) and backward (gradients) maps override them.
struct TransportSpec {
  Compression compression = Compression::kNone;
  int block = 64;
  bool rotate = false;
  // Gradients sent with a lossy format carry what the last send of the same
  // micro-batch slot lost (kept per slot, checkpointed).
  bool error_feedback = false;
  WireFormatSpec forward;   // resolved: the top-level keys, then transport.forward
  WireFormatSpec backward;  // resolved: the top-level keys, then transport.backward
};

// The pipeline timeline (docs/trace.md): stages record what their compute
// thread does during steps [from, to) of each phase and send it to the
// coordinator. Off unless the job has a `trace:` section.
// Rebalancing while training (docs/fault_tolerance.md, "Rebalancing"): a
// planned job whose slowest stage runs more than `threshold` over its plan,
// against the other stages, for `window_steps` steps in a row is
// checkpointed, re-planned on the measured speeds and resumed on the new
// cut. Off while threshold is 0.
struct RebalanceSpec {
  double threshold = 0;
  int64_t window_steps = 200;
  double max_per_hour = 2;
};

struct TraceSpec {
  bool enabled = false;
  int64_t from = 0;           // trace.steps: [from, to]: the first step kept ...
  int64_t to = 10;            // ... and one past the last
  int64_t max_spans = 20000;  // per stage; later spans are counted, not kept
};

struct JobSpec {
  std::string name;
  int64_t seed = 0;
  std::string device = "cpu";
  // The job's priority class: one of the coordinator's --scheduling-config
  // classes (empty: its default class). Checked by the coordinator.
  std::string priority;
  ModelSpec model;
  DataSpec data;
  AlgorithmSpec algorithm;
  StagesSpec stages;
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  int64_t batch_size = 128;
  int64_t eval_batch_size = 0;  // 0 = batch_size
  double epochs = 0;            // exactly one of epochs / steps is > 0
  int64_t steps = 0;
  EvalSpec eval;
  CheckpointSpec checkpoint;
  RecoverySpec recovery;
  SyncSpec sync;
  PlacementSpec placement;
  TransportSpec transport;
  TraceSpec trace;
  RebalanceSpec rebalance = {};
  // Optional. When given, `algorithm` is the first phase's and epochs/steps
  // the sum over phases.
  std::vector<PhaseSpec> phases;
};

// The job text with its length replaced by `steps` (smoke runs): the
// top-level epochs/steps, or with phases every phase's. Comments and key
// order are not kept. INVALID_ARGUMENT if the text is not a YAML map.
absl::StatusOr<std::string> OverrideSteps(const std::string& yaml_text, int64_t steps);

// The job text with each "key.path=value" of `assignments` set, as the CLI's
// --set does: the value is read as YAML (256, 0.1, true, [1, 2], text),
// missing sections are created, and the short forms `algorithm: NAME` and
// `stages: N` become maps. The result is not validated: parse it. Comments
// and key order are not kept. INVALID_ARGUMENT naming the assignment when it
// is not KEY=VALUE or walks into a value that is not a map.
absl::StatusOr<std::string> OverrideKeys(const std::string& yaml_text,
                                         const std::vector<std::string>& assignments);

// The phases to run: the explicit ones, or one phase made of the top-level
// algorithm, optimizer, schedule and length.
std::vector<PhaseSpec> Phases(const JobSpec& spec);

// backprop's `schedule: auto` in `phases` becomes `chosen` (the planner's
// pick, StageAssignment.schedule: gpipe, 1f1b or zb-h1), or 1f1b when
// nothing was chosen (an assignment without a plan). INVALID_ARGUMENT for
// interleaved, which auto never picks.
absl::Status ResolveAutoSchedule(std::optional<PipelineSchedule> chosen,
                                 std::vector<PhaseSpec>& phases);

// Parses and validates a job. Errors are INVALID_ARGUMENT naming the key path
// and where it is, e.g. "optimizer.momentum: must be in [0, 1), got 1.5
// (line 7, column 3)". All of a document's errors are reported (at most 20),
// one per line after "N errors in the job spec:"; one error keeps the
// single-line form.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text);
// The same with the CLI's --set assignments applied to the document first
// (as OverrideKeys): errors in the file keep its lines and columns, errors in
// what an assignment wrote say "(--set KEY)".
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text,
                                     const std::vector<std::string>& assignments);
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);
// A job file's text, unparsed: NOT_FOUND, or INVALID_ARGUMENT for a
// directory or a file over the size cap, naming the path.
absl::StatusOr<std::string> ReadJobFile(const std::string& path);

// The number of classes and the per-sample input shape of a dataset as named in
// a DataSpec (fashion_mnist: [1,28,28]/10, cifar10: [3,32,32]/10, ...).
absl::Status FillDataShape(const DataSpec& data, ModelSpec* model);

// The semantic checks of ParseJobSpec on an already built spec: value ranges,
// cross-field rules (nesterov needs momentum, nwise n <= stages.count, ...).
absl::Status ValidateJobSpec(const JobSpec& spec);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_SPEC_JOB_SPEC_H_
