// The planner (docs/planner.md): from a ModelProfile, the partition over J
// workers that minimises the slowest stage under each worker's memory cap,
// the mode of every reversible block (store = compute-centric, rebuild =
// memory-centric, as in "An Efficient Training Framework for Reversible
// Neural Architectures") and each algorithm's predicted time per mini-batch.
//
// Memory model (what a stage's CPU tensors peak at, as the memory meter
// counts them): parameters, BatchNorm buffers, gradients and optimizer state;
// the mini-batch input (and labels on the first and last stage); per
// mini-batch in flight, the graphs of storing blocks and every activation a
// storing block keeps (its input, or the output of a storing segment); then
// the backward walked block by block with each block's measured transient.
#ifndef STAGEWISE_SERVICES_PLANNER_PLANNER_H_
#define STAGEWISE_SERVICES_PLANNER_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/planner/profile.h"
#include "services/spec/job_spec.h"

namespace stagewise::planner {

// Where a stage sits and how many mini-batches (or micro-batches) it holds
// between forward and backward.
struct StageRole {
  bool first = false;
  bool last = false;
  int inflight = 1;
  // Copies of the stage's parameters held beside them, on stages with a
  // delay (not the last): `delayed`'s stashed weights (one per mini-batch in
  // flight, and the current ones while a backward runs at a stash) and the
  // look-ahead's (`predict_weights`: w_prev, and the current weights while a
  // forward runs at the predicted ones).
  int parameter_copies = 0;
  // `delayed` with `forward: once`: each mini-batch in flight keeps its graph
  // (estimated as backprop's at this depth) and nothing is recomputed.
  bool keeps_graphs = false;
};

struct StageEstimate {
  double forward_s = 0;   // per mini-batch, as the algorithm runs it
  double backward_s = 0;  // including rebuilds and recomputations
  double step_s = 0;
  double message_s = 0;   // encoding and decoding the stage's messages
  double aux_head_s = 0;  // nwise: the stage's aux head
  // Sending over the links (PlanOptions::link_bytes_per_s): the stage's
  // output forward and its input's gradient back.
  double link_s = 0;
  // The formats it sends with: transport's, or what `compression: auto`
  // chose (ChooseWire); never kAuto.
  Compression forward_wire = Compression::kNone;
  Compression backward_wire = Compression::kNone;
  // Parameters, buffers, gradients, optimizer state, and the role's
  // parameter copies.
  int64_t static_bytes = 0;
  int64_t kept_bytes = 0;  // what one mini-batch keeps between forward and backward
  int64_t peak_bytes = 0;
  double time_s() const { return forward_s + backward_s + step_s + message_s + link_s; }
};

// Memory and time of blocks [begin, end) of `profile` under `store` (one
// entry per block; rebuild only on reversible blocks), for "backprop"
// (graph-keeping forward) or "petra" (graph-free forward, stored or rebuilt
// inputs). Other algorithms are estimated as backprop with every block
// storing, plus their own extra work.
StageEstimate EstimateStage(const ModelProfile& profile, AlgorithmKind algorithm, int begin,
                            int end, const std::vector<bool>& store, const StageRole& role);

struct PlanOptions {
  int num_stages = 1;
  // Per worker, bytes; 0 = no cap. One entry applies to every worker.
  std::vector<int64_t> memory_caps;
  AlgorithmKind algorithm = AlgorithmKind::kBackprop;  // whose memory model and modes
  // Fixed ranges (empty: the planner partitions).
  std::vector<std::pair<int, int>> ranges;
  // auto: the knapsack under the cap; store / rebuild: every reversible block.
  BlockModes modes = BlockModes::kAuto;
  int micro_batches = 1;  // backprop / nwise
  // backprop; empty: `schedule: auto` (ChooseSchedule picks one).
  std::optional<PipelineSchedule> schedule = PipelineSchedule::kGpipe;
  int lookahead = 0;  // backprop 1F1B and ZB-H1: extra micro-batches in flight per stage
  int nwise_n = 0;    // 0: predicted for n = 1 and n = 2
  // Their memory (StageRole::parameter_copies): delayed's `weights: stash`
  // (the default) and the look-ahead of delayed and petra.
  bool stash_weights = true;
  bool predict_weights = false;
  // delayed: `forward` resolved (once, the default with stash: a graph per
  // mini-batch in flight; false: recompute) and `max_in_flight` (0: the
  // natural depth 2(J-1-j)+1; n: at most n; kAutoInFlight: the depth that
  // covers the links' round trip, CoveringDepths).
  bool forward_once = true;
  int max_in_flight = 0;
  // delayed: each stage's depth in flight, whatever max_in_flight says
  // (MakePlan sets it for max_in_flight: auto and plans the memory at it);
  // empty: from max_in_flight.
  std::vector<int> in_flight;
  // Knapsack units: at most this many per stage budget.
  int64_t max_units = 4096;
  // Interleaved (stages.chunks_per_worker): num_stages virtual stages on
  // num_stages / chunks workers; predicted under the interleaved order.
  int chunks = 1;
  // Heterogeneous workers (placement.per_worker_profiles): stage j's times
  // and bytes from the profile measured on the worker that runs it (size
  // num_stages); empty: the one profile for every stage.
  std::vector<ModelProfile> stage_profiles;
  // The links between neighbouring workers (placement.link_gbps,
  // link_rtt_ms): a message of b bytes takes link_latency_s + b /
  // link_bytes_per_s, counted in the sending stage's time. 0: not modelled.
  double link_bytes_per_s = 0;
  double link_latency_s = 0;
  // What an activation (forward) and a gradient (backward) cross the links
  // as: transport.forward / transport.backward. Their bytes per float32 byte
  // scale the link time (WireBytesRatio); `compression: auto` is resolved
  // per stage by ChooseWire.
  WireFormatSpec forward_wire;
  WireFormatSpec backward_wire;
};

// Bytes a format sends per float32 byte: 1 (none), 1/2 (fp16, bf16),
// 1/4 + 1/block (int8: a byte a value and a float32 scale a block),
// 1/8 + 1/block (int4); 1 for auto (not resolved).
double WireBytesRatio(Compression compression, int block);
inline double WireBytesRatio(const WireFormatSpec& format) {
  return WireBytesRatio(format.compression, format.block);
}

// What one stage sends per mini-batch over its link: its output forward
// (`forward_bytes` of float32, 0 on the last stage) and its input's gradient
// back (`backward_bytes`, 0 on the first; `backward_tensors` of them: PETRA's
// carries the rebuilt input too).
struct StageSends {
  int64_t forward_bytes = 0;
  int64_t backward_bytes = 0;
  int backward_tensors = 1;
};
// Seconds on the link for `sends` in `wire`'s formats (blocks as `options`'
// formats say): latency + bytes / link_bytes_per_s per message; 0 when no
// link is modelled.
double LinkSeconds(const StageSends& sends, const WireChoice& wire, const PlanOptions& options);
// `compression: auto` for one stage: the least lossy of none, bf16, int8 and
// int4, taken by every auto direction alike, whose link time for everything
// the stage sends (both directions share its link) is at most `compute_s`;
// int4 when none is. Fixed directions stay as the job says; auto is none
// when no link is modelled.
WireChoice ChooseWire(const StageSends& sends, double compute_s, const PlanOptions& options);

// The options a job implies: its stage count, first phase's algorithm (and
// micro-batches / n), stages.modes and stages.memory_budget; `ranges` (the
// job's resolved partition, models::ResolvePartition) unless
// stages.partition is auto, which leaves the partition to the planner.
PlanOptions PlanOptionsForJob(const JobSpec& spec, const std::vector<std::pair<int, int>>& ranges);

struct StagePlan {
  int begin = 0, end = 0;
  std::vector<bool> store;  // per block of the stage
  int64_t cap_bytes = 0;    // 0 = none
  StageRole role;
  StageEstimate estimate;
};

// What a prediction is of: an algorithm and the choices that change its time
// (keyed by these, never by its display text).
struct PredictionKey {
  AlgorithmKind algorithm = AlgorithmKind::kBackprop;
  // backprop with micro-batches: the schedule simulated (empty: plain
  // backprop, one micro-batch at a time).
  std::optional<PipelineSchedule> schedule;
  int micro_batches = 1;  // backprop with a schedule
  int chunks = 1;         // backprop interleaved: chunks per worker
  int nwise_n = 0;        // nwise: n
  bool operator==(const PredictionKey& o) const {
    return algorithm == o.algorithm && schedule == o.schedule && micro_batches == o.micro_batches &&
           chunks == o.chunks && nwise_n == o.nwise_n;
  }
};
// How a key is shown: "petra", "backprop 1f1b M=4", "backprop interleaved
// v=2 M=4", "nwise n=2".
std::string LabelOf(const PredictionKey& key);

struct Prediction {
  PredictionKey key;
  double seconds_per_batch = 0;
  double speedup = 0;  // backprop's time / this one
  std::string model;   // how it was computed
  // Steps between a mini-batch's forward and its gradient's update on the
  // most delayed stage (stage 0): 0 for the exact schedules.
  int staleness = 0;
  std::string label() const { return LabelOf(key); }
};

struct Plan {
  AlgorithmKind algorithm = AlgorithmKind::kBackprop;
  // PlanOptions' wire formats (each stage's choice is in its estimate).
  WireFormatSpec forward_wire;
  WireFormatSpec backward_wire;
  std::vector<StagePlan> stages;
  double bottleneck_s = 0;
  std::vector<Prediction> predictions;
  // The prediction of `key`, or null.
  const Prediction* Find(const PredictionKey& key) const {
    for (const Prediction& p : predictions) {
      if (p.key == key) return &p;
    }
    return nullptr;
  }
};

// Modes for one stage under `cap_bytes` (0: every block stores unless
// options.modes says otherwise). NOT_FOUND-free: RESOURCE_EXHAUSTED when even
// the all-rebuild choice does not fit.
absl::StatusOr<StagePlan> PlanStage(const ModelProfile& profile, const PlanOptions& options,
                                    int begin, int end, const StageRole& role, int64_t cap_bytes);

// The whole plan: the partition (DP over ranges, each costed by PlanStage),
// modes and predictions. RESOURCE_EXHAUSTED names the cap nothing fits under.
// delayed with max_in_flight: auto: planned at the natural depths, then
// again at CoveringDepths (each stage's StagePlan::role.inflight).
absl::StatusOr<Plan> MakePlan(const ModelProfile& profile, const PlanOptions& options);

// A decoupled plan's depths in flight that cover the links' round trip:
// stage j keeps d_j >= (2 W_j + H_j + c_j) / T mini-batches, T the slowest
// stage's work or link busy time, W_j a mini-batch's work on every later
// stage (counted twice: in the 1F1B order it waits up to one operation at
// each), H_j two hops per link on the way and c_j its own work, and at least
// d_{j+1} + 2; the last stage 1. On equal stages without latency that is the
// natural depth 2(J-1-j)+1; with it the pipeline runs at T whatever the
// latency, at a staleness of d_j - 1 mini-batches.
std::vector<int> CoveringDepths(const ModelProfile& profile, const Plan& plan,
                                const PlanOptions& options);

// backprop's `schedule: auto`: MakePlan under each of 1f1b, zb-h1 and gpipe
// (not zb-h1 with stages.modes rebuild: a rebuild block cannot split its
// backward) and the one with the smallest predicted time per mini-batch among
// those that fit the caps; on a tie, the smaller largest stage peak, then
// that order. `tried` has every candidate's predicted seconds, or -1 where it
// did not fit. The last candidate's error when none fits.
struct ScheduleChoice {
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  Plan plan;
  std::vector<std::pair<PipelineSchedule, double>> tried;
};
absl::StatusOr<ScheduleChoice> ChooseSchedule(const ModelProfile& profile, PlanOptions options);

// Predicted seconds per mini-batch of `algorithm` on the plan's partition
// (the plan's modes for backprop and petra).
std::vector<Prediction> PredictAlgorithms(const ModelProfile& profile, const Plan& plan,
                                          const PlanOptions& options);

// The plan as JobStatus.summary entries, in stage order then predictions:
//   plan.stageJ.{block_begin,block_end,peak_bytes,seconds_per_batch,rebuild_blocks}
//   plan.stageJ.in_flight (delayed: mini-batches in flight, the staleness + 1)
//   plan.predicted.<algorithm> (seconds per mini-batch; "nwise n=1" -> nwise_n1:
//   summary keys carry no spaces and no '=').
std::vector<std::pair<std::string, double>> PlanSummary(const Plan& plan);

std::string PlanText(const ModelProfile& profile, const Plan& plan);
std::string PlanJson(const ModelProfile& profile, const Plan& plan);
std::string ProfileText(const ModelProfile& profile);
// "2GiB", "512MiB", "1.5G", "1000000" -> bytes; INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> ParseBytes(const std::string& text);
std::string HumanBytes(int64_t bytes);

}  // namespace stagewise::planner

#endif  // STAGEWISE_SERVICES_PLANNER_PLANNER_H_
