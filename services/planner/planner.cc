#include "services/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "services/planner/knapsack.h"
#include "services/planner/partition.h"
#include "services/planner/pipeline_schedule.h"
#include "services/planner/timing_model.h"
#include "services/spec/job_spec.h"

namespace stagewise::planner {
namespace {

using A = AlgorithmKind;

// Backprop on the modal pass (services/models/modal_pass.h): storing blocks
// keep their graph; an activation between blocks stays while either
// neighbour stores; the backward walks the blocks last to first.
void EstimateGraphKeeping(const ModelProfile& p, int begin, int end, const std::vector<bool>& store,
                          const StageRole& role, StageEstimate& s) {
  const int n = end - begin;
  auto B = [&](int i) -> const BlockProfile& { return p.blocks[begin + i]; };
  auto live = [&](int k) { return k >= 1 && k <= n - 1 && (store[k - 1] || store[k]); };
  const int64_t in0 = B(0).input_bytes + ((role.first || role.last) ? p.label_bytes : 0);
  int64_t kept = B(n - 1).output_bytes;
  for (int i = 0; i < n; ++i) {
    if (store[i]) kept += B(i).graph_bytes;
    if (live(i)) kept += B(i).input_bytes;
  }
  s.kept_bytes = kept;
  const int64_t base =
      s.static_bytes + static_cast<int64_t>(role.inflight - 1) * (in0 + kept) + in0;
  int64_t peak = base, prefix = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t own = (store[i] ? B(i).graph_bytes : 0) + B(i).output_bytes;
    const int64_t input = (i > 0 && !live(i)) ? B(i).input_bytes : 0;
    peak = std::max(peak, base + prefix + input + own + B(i).forward_transient_bytes);
    prefix += (store[i] ? B(i).graph_bytes : 0) + (live(i + 1) ? B(i + 1).input_bytes : 0);
  }
  int64_t cur = base + kept + B(n - 1).output_bytes;  // + the output's gradient
  int64_t extra = 0;  // a rebuilt copy of an activation a storing neighbour also keeps
  for (int i = n - 1; i >= 0; --i) {
    const int64_t t = store[i] ? B(i).backward_transient_bytes : B(i).rebuild_transient_bytes;
    peak = std::max(peak, cur + t);
    if (store[i]) cur -= B(i).graph_bytes;
    cur -= 2 * B(i).output_bytes + extra;  // the output's gradient and the output
    extra = 0;
    if (i > 0 || !role.first) cur += B(i).input_bytes;  // the input's gradient
    if (!store[i]) {
      cur += B(i).input_bytes;  // the rebuilt input
      if (live(i)) extra = B(i).input_bytes;
    }
  }
  s.peak_bytes = peak;
}

// Graph-free forward keeping inputs (PETRA, delayed, features replay): per
// mini-batch in flight the stored inputs; the backward rebuilds or
// recomputes one block (PETRA) or the whole stage (recompute) at a time.
void EstimateInputKeeping(const ModelProfile& p, int begin, int end, const std::vector<bool>& keep,
                          bool per_block, const StageRole& role, StageEstimate& s) {
  const int n = end - begin;
  auto B = [&](int i) -> const BlockProfile& { return p.blocks[begin + i]; };
  int64_t kept = 0;
  for (int i = 0; i < n; ++i) {
    if (keep[i]) kept += B(i).input_bytes;
  }
  s.kept_bytes = kept;
  const int64_t base = s.static_bytes + static_cast<int64_t>(role.inflight) * kept;
  int64_t peak = base;
  for (int i = 0; i < n; ++i) {
    peak = std::max(peak, base + B(i).input_bytes + B(i).output_bytes);
  }
  const int64_t out2 = 2 * B(n - 1).output_bytes;  // the returned activation and gradient
  if (per_block) {
    int64_t cur = base + out2;
    for (int i = n - 1; i >= 0; --i) {
      const bool rebuild = B(i).reversible && !keep[i];
      const int64_t t = rebuild
                            ? B(i).rebuild_transient_bytes
                            : B(i).graph_bytes + B(i).output_bytes + B(i).backward_transient_bytes;
      peak = std::max(peak, cur + t);
      cur += 2 * (B(i).input_bytes - B(i).output_bytes);
    }
  } else {
    // The whole stage recomputed with a graph from its input.
    std::vector<bool> all(n, true);
    StageEstimate g;
    g.static_bytes = 0;
    StageRole one = role;
    one.inflight = 1;
    EstimateGraphKeeping(p, begin, end, all, one, g);
    peak = std::max(peak, base + out2 + g.peak_bytes);
  }
  s.peak_bytes = peak;
}

std::vector<bool> DefaultStore(const ModelProfile& p, AlgorithmKind algorithm, int begin, int end) {
  std::vector<bool> store(end - begin, true);
  if (algorithm == A::kPetra) {
    for (int i = begin; i < end; ++i) store[i - begin] = !p.blocks[i].reversible;
  }
  return store;
}

// The schedule whose in-flight memory a stage plans for: auto (until
// ChooseSchedule picks) and interleaved (per virtual stage) as 1F1B.
PipelineSchedule MemoryScheduleOf(std::optional<PipelineSchedule> s) {
  if (!s.has_value() || *s == PipelineSchedule::kInterleaved) return PipelineSchedule::kOneFOneB;
  return *s;
}

StageRole RoleOf(const PlanOptions& o, int j) {
  StageRole r;
  const int J = o.num_stages;
  r.first = j == 0;
  r.last = j == J - 1;
  const AlgorithmKind a = o.algorithm;
  if (a == A::kBackprop) {
    pipeline::ScheduleOptions so{
        .stages = J, .micro_batches = std::max(1, o.micro_batches), .lookahead = o.lookahead};
    r.inflight = pipeline::MaxInFlight(MemoryScheduleOf(o.schedule), so, j);
  } else if (a == A::kNwise) {
    r.inflight = r.last ? 1 : std::max(1, o.micro_batches);
  } else if (a == A::kPetra) {
    r.inflight = r.last ? 1 : 2 * (J - 1 - j) + 1;
  } else if (a == A::kDelayed) {
    r.inflight = r.last ? 1 : 2 * (J - 1 - j) + 1;
    if (!o.in_flight.empty()) {
      r.inflight = r.last ? 1 : o.in_flight[j];
    } else if (o.max_in_flight > 0) {
      r.inflight = std::min(r.inflight, o.max_in_flight);
    }
    r.keeps_graphs = o.forward_once && o.stash_weights && !r.last;  // once needs the stash
  } else if (a == A::kFeaturesReplay) {
    r.inflight = J - j;
  }
  if (!r.last) {
    // delayed's stash: one per mini-batch in flight, and the current weights
    // while a backward runs at its stashed ones; the look-ahead: w_prev, and
    // the current weights while a forward runs at the predicted ones (the
    // stash's copy when there is one: never both at once).
    // (forward: once: a graph runs at its stash in place, no copy back.)
    const bool stash = a == A::kDelayed && o.stash_weights;
    const bool predict = (a == A::kDelayed || a == A::kPetra) && o.predict_weights;
    if (stash) r.parameter_copies += r.inflight + (r.keeps_graphs ? 0 : 1);
    if (predict) r.parameter_copies += stash ? 1 : 2;
  }
  return r;
}

// Stage j's profile: the one measured on its worker, else the job's one.
const ModelProfile& ProfileOfStage(const ModelProfile& p, const PlanOptions& o, int j) {
  return j < static_cast<int>(o.stage_profiles.size()) ? o.stage_profiles[j] : p;
}

// The links (PlanOptions::link_bytes_per_s): stage [begin, end) sends its
// output forward and its input's gradient back, one message of the
// boundary's size each way.
// Under `compression: auto` the stage's formats are the least lossy whose
// link time fits under its compute (ChooseWire).
void AddLinkTime(const ModelProfile& p, const PlanOptions& o, int begin, int end,
                 const StageRole& role, StageEstimate& s) {
  StageSends sends;
  if (!role.last) sends.forward_bytes = p.blocks[end - 1].output_bytes;
  if (!role.first) sends.backward_bytes = p.blocks[begin].input_bytes;
  // PETRA's backward carries the rebuilt input beside the gradient.
  sends.backward_tensors = o.algorithm == A::kPetra ? 2 : 1;
  const WireChoice wire = ChooseWire(sends, s.time_s() + s.aux_head_s, o);
  s.forward_wire = role.last ? Compression::kNone : wire.forward;
  s.backward_wire = role.first ? Compression::kNone : wire.backward;
  s.link_s += LinkSeconds(sends, wire, o);
}

// One message across the link after stage s (its output forward; the
// gradient back has the same size): the link's latency plus the message's
// bytes at the link's rate, `per` of a mini-batch's (a micro-batch's share).
double HopSeconds(const ModelProfile& p, const PlanOptions& o, const StagePlan& s, double per) {
  double t = o.link_latency_s;
  if (o.link_bytes_per_s > 0) {
    t += per * static_cast<double>(p.blocks[s.end - 1].output_bytes) *
         WireBytesRatio(o.forward_wire) / o.link_bytes_per_s;
  }
  return t;
}

// A decoupled pipeline in steady state (delayed, petra, features replay).
// Stage j keeps d_j mini-batches in flight; one comes back to it after
// crossing every later stage and link and back: its round trip R_j is the
// later stages' work plus two hops per link on the way. Stage j starts d_j
// mini-batches per R_j + c_j (its own work c_j), so a step takes the longest
// of every stage's work, every link's busy time (the floor no depth beats)
// and (R_j + c_j) / d_j: latency is paid once per round trip, not per step,
// and a deep enough pipeline hides it.
struct RoundTrips {
  double floor_s = 0;
  std::vector<double> cycle_s;  // R_j + c_j, by stage (the last stage's: c)
  std::vector<double> later_s;  // the later stages' work in R_j
};
RoundTrips DecoupledRoundTrips(const std::vector<StageEstimate>& e,
                               const std::vector<StageRole>& roles, const std::vector<double>& hop,
                               const PlanOptions& o, int backward_tensors) {
  const int J = static_cast<int>(e.size());
  RoundTrips out;
  out.cycle_s.assign(J, 0);
  out.later_s.assign(J, 0);
  std::vector<double> c(J);
  for (int j = 0; j < J; ++j) {
    c[j] = e[j].time_s() - e[j].link_s + e[j].aux_head_s;
    // The link carries the stage's messages while it computes: its busy
    // time is the bytes at the rate, the latency overlapping.
    const int messages = (roles[j].last ? 0 : 1) + (roles[j].first ? 0 : backward_tensors);
    out.floor_s = std::max({out.floor_s, c[j], e[j].link_s - messages * o.link_latency_s});
  }
  if (J > 0) out.cycle_s[J - 1] = c[J - 1];
  double later = 0, links = 0;
  for (int j = J - 2; j >= 0; --j) {
    later += c[j + 1];
    links += 2 * hop[j];
    out.cycle_s[j] = later + links + c[j];
    out.later_s[j] = later;
  }
  return out;
}

// The time per mini-batch at the roles' depths.
double DecoupledSeconds(const std::vector<StageEstimate>& e, const std::vector<StageRole>& roles,
                        const std::vector<double>& hop, const PlanOptions& o,
                        int backward_tensors) {
  const RoundTrips r = DecoupledRoundTrips(e, roles, hop, o, backward_tensors);
  double t = r.floor_s;
  for (int j = 0; j + 1 < static_cast<int>(e.size()); ++j) {
    t = std::max(t, r.cycle_s[j] / std::max(1, roles[j].inflight));
  }
  return t;
}

// Each link's message of a whole mini-batch.
std::vector<double> Hops(const ModelProfile& p, const PlanOptions& o, const Plan& plan) {
  std::vector<double> hop;
  for (int j = 0; j + 1 < static_cast<int>(plan.stages.size()); ++j) {
    hop.push_back(HopSeconds(ProfileOfStage(p, o, j), o, plan.stages[j], 1.0));
  }
  return hop;
}

}  // namespace

StageEstimate EstimateStage(const ModelProfile& p, AlgorithmKind algorithm, int begin, int end,
                            const std::vector<bool>& store, const StageRole& role) {
  StageEstimate s;
  const int n = end - begin;
  auto B = [&](int i) -> const BlockProfile& { return p.blocks[begin + i]; };
  for (int i = 0; i < n; ++i) {
    s.static_bytes += (2 + role.parameter_copies) * B(i).parameter_bytes + B(i).buffer_bytes +
                      B(i).optimizer_bytes;
    s.step_s += B(i).step_s;
  }
  const double msg_in = role.first ? 0.0 : p.blocks[begin - 1].message_s;
  const double msg_out = role.last ? 0.0 : B(n - 1).message_s;
  s.message_s = msg_in + msg_out;
  const bool graph_free =
      !role.last && (algorithm == A::kPetra || (algorithm == A::kDelayed && !role.keeps_graphs) ||
                     algorithm == A::kFeaturesReplay);
  for (int i = 0; i < n; ++i) {
    const BlockProfile& b = B(i);
    if (graph_free) {
      s.forward_s += b.forward_nograd_s;
      if (algorithm == A::kFeaturesReplay) {
        // The replay forward keeps the graph; the backward is then a plain VJP.
        s.forward_s += b.forward_s;
        s.backward_s += b.backward_s;
      } else {
        const bool rebuild = algorithm == A::kPetra && b.reversible && !store[i];
        s.backward_s += rebuild ? b.rebuild_backward_s : b.forward_s + b.backward_s;
      }
    } else {
      s.forward_s += store[i] ? b.forward_s : b.forward_nograd_s;
      s.backward_s += store[i] ? b.backward_s : b.rebuild_backward_s;
    }
  }
  if (algorithm == A::kPetra && !role.last) s.message_s *= 1.5;  // backward carries x and grad
  if (algorithm == A::kNwise && !role.last) s.aux_head_s = B(n - 1).aux_head_s;
  if (graph_free) {
    std::vector<bool> keep(n, false);
    if (algorithm == A::kPetra) {
      for (int i = 0; i < n; ++i) keep[i] = !B(i).reversible || store[i];
    } else {
      keep[0] = true;
    }
    EstimateInputKeeping(p, begin, end, keep, algorithm == A::kPetra, role, s);
  } else {
    EstimateGraphKeeping(p, begin, end, store, role, s);
  }
  return s;
}

absl::StatusOr<StagePlan> PlanStage(const ModelProfile& p, const PlanOptions& o, int begin, int end,
                                    const StageRole& role, int64_t cap) {
  const AlgorithmKind a = o.algorithm;
  const bool modal = a == A::kBackprop || a == A::kPetra;
  const int n = end - begin;
  StagePlan sp;
  sp.begin = begin;
  sp.end = end;
  sp.role = role;
  sp.cap_bytes = cap;
  auto estimate = [&](const std::vector<bool>& store) {
    StageEstimate e = EstimateStage(p, a, begin, end, store, role);
    AddLinkTime(p, o, begin, end, role, e);
    return e;
  };
  auto fits = [&](const StageEstimate& e) { return cap <= 0 || e.peak_bytes <= cap; };
  std::vector<bool> lowest(n), highest(n);
  for (int i = 0; i < n; ++i) {
    const bool rev = p.blocks[begin + i].reversible;
    lowest[i] = !(modal && rev);
    highest[i] = true;
  }
  auto exhausted = [&](const StageEstimate& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("blocks [", begin, ", ", end, ") need ", HumanBytes(e.peak_bytes),
                     " at least, over the ", HumanBytes(cap), " memory cap"));
  };
  if (!modal) {
    sp.store = DefaultStore(p, a, begin, end);
    sp.estimate = estimate(sp.store);
    if (fits(sp.estimate)) return sp;
    if (role.keeps_graphs) {
      // Name the key that would make it fit, if one does.
      StageRole recompute = role;
      recompute.keeps_graphs = false;
      if (o.stash_weights) recompute.parameter_copies += 1;
      const StageEstimate r = EstimateStage(p, a, begin, end, sp.store, recompute);
      return absl::ResourceExhaustedError(absl::StrCat(
          "algorithm.forward: once keeps a graph per mini-batch in flight (", role.inflight,
          " here): blocks [", begin, ", ", end, ") need ", HumanBytes(sp.estimate.peak_bytes),
          ", over the ", HumanBytes(cap), " memory cap; forward: recompute needs ",
          HumanBytes(r.peak_bytes), fits(r) ? " and fits" : ", over it too",
          " (or lower algorithm.max_in_flight)"));
    }
    return exhausted(sp.estimate);
  }
  if (o.modes != BlockModes::kAuto || cap <= 0) {
    sp.store = o.modes == BlockModes::kRebuild ? lowest
               : o.modes == BlockModes::kStore ? highest
                                               : DefaultStore(p, a, begin, end);
    if (o.modes == BlockModes::kAuto && a == A::kBackprop) sp.store = highest;
    sp.estimate = estimate(sp.store);
    if (!fits(sp.estimate)) return exhausted(sp.estimate);
    return sp;
  }
  // auto under a cap: store everything that pays, as far as the cap allows.
  const StageEstimate top = estimate(highest);
  if (fits(top)) {
    sp.store = highest;
    sp.estimate = top;
    return sp;
  }
  const StageEstimate low = estimate(lowest);
  if (!fits(low)) return exhausted(low);
  const bool petra = a == A::kPetra;
  const int64_t inflight = std::max(1, role.inflight);
  std::vector<int64_t> weight(n), boundary(n, 0);
  std::vector<double> value(n);
  for (int i = 0; i < n; ++i) {
    const BlockProfile& b = p.blocks[begin + i];
    if (petra) {
      weight[i] = b.input_bytes * inflight;
      // Storing buys exactness, and rarely time: a tiny value breaks ties towards storing.
      value[i] = std::max(0.0, b.rebuild_backward_s - b.forward_s - b.backward_s) + 1e-9;
    } else {
      weight[i] = b.graph_bytes * inflight;
      if (i >= 1) boundary[i] = b.input_bytes * inflight;
      value[i] = std::max(0.0, (b.forward_nograd_s + b.rebuild_backward_s) -
                                   (b.forward_s + b.backward_s)) +
                 1e-9;
    }
  }
  auto variable = [&](const std::vector<bool>& x) {
    int64_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (x[i]) v += weight[i];
      if (i >= 1 && (x[i] || x[i - 1])) v += boundary[i];
    }
    return v;
  };
  int64_t budget = cap - low.peak_bytes + variable(lowest);
  sp.store = lowest;
  sp.estimate = low;
  for (int attempt = 0; attempt < 16 && budget > 0; ++attempt) {
    const int64_t unit = std::max<int64_t>(1, (budget + o.max_units - 1) / o.max_units);
    std::vector<ChainItem> items(n);
    for (int i = 0; i < n; ++i) {
      items[i].value = value[i];
      items[i].weight = WeightUnits(weight[i], unit);
      items[i].boundary = WeightUnits(boundary[i], unit);
      items[i].forced = lowest[i];
    }
    KnapsackResult r = ChainKnapsack(items, CapacityUnits(budget, unit));
    if (r.value < 0) break;
    const StageEstimate e = estimate(r.chosen);
    if (fits(e)) {
      sp.store = r.chosen;
      sp.estimate = e;
      break;
    }
    budget -= (e.peak_bytes - cap) + unit;
  }
  return sp;
}

absl::StatusOr<Plan> MakePlan(const ModelProfile& p, const PlanOptions& o) {
  const int J = o.num_stages;
  const int n = static_cast<int>(p.blocks.size());
  if (J < 1) return absl::InvalidArgumentError("stages.count: must be at least 1");
  if (n < J) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages.count: ", J, " stages for a model of ", n, " blocks"));
  }
  auto cap = [&](int j) -> int64_t {
    if (o.memory_caps.empty()) return 0;
    return o.memory_caps.size() == 1 ? o.memory_caps[0] : o.memory_caps[j];
  };
  if (o.memory_caps.size() > 1 && static_cast<int>(o.memory_caps.size()) != J) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.memory_caps.size(), " memory caps for ", J, " workers"));
  }
  if (!o.stage_profiles.empty()) {
    if (static_cast<int>(o.stage_profiles.size()) != J) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.stage_profiles.size(), " worker profiles for ", J, " stages"));
    }
    for (const ModelProfile& w : o.stage_profiles) {
      if (w.blocks.size() != p.blocks.size()) {
        return absl::InvalidArgumentError(absl::StrCat("a worker's profile has ", w.blocks.size(),
                                                       " blocks, the model ", p.blocks.size()));
      }
    }
  }
  std::map<std::tuple<int, int, int>, absl::StatusOr<StagePlan>> memo;
  auto stage = [&](int b, int e, int j) -> const absl::StatusOr<StagePlan>& {
    auto key = std::make_tuple(b, e, j);
    auto it = memo.find(key);
    if (it == memo.end()) {
      it = memo.emplace(key, PlanStage(ProfileOfStage(p, o, j), o, b, e, RoleOf(o, j), cap(j)))
               .first;
    }
    return it->second;
  };
  auto cost = [&](int b, int e, int j) {
    const auto& s = stage(b, e, j);
    if (!s.ok()) return std::numeric_limits<double>::infinity();
    return s->estimate.time_s() + s->estimate.aux_head_s;
  };
  std::vector<std::pair<int, int>> ranges = o.ranges;
  if (ranges.empty()) {
    PartitionResult r = MinMaxPartition(n, J, cost);
    if (!r.feasible) {
      // Name the cheapest failure: the whole model on one stage's cap.
      absl::Status why = absl::ResourceExhaustedError("no partition fits the memory caps");
      for (int j = 0; j < J; ++j) {
        const auto& s = stage(j, j + 1, j);
        if (!s.ok()) why = s.status();
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "no partition over ", J, " workers fits the memory caps (", why.message(), ")"));
    }
    ranges = r.ranges;
  }
  if (static_cast<int>(ranges.size()) != J) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages.partition: ", ranges.size(), " ranges for ", J, " stages"));
  }
  Plan plan;
  plan.algorithm = o.algorithm;
  plan.forward_wire = o.forward_wire;
  plan.backward_wire = o.backward_wire;
  for (int j = 0; j < J; ++j) {
    const auto& s = stage(ranges[j].first, ranges[j].second, j);
    if (!s.ok()) {
      return absl::Status(s.status().code(), absl::StrCat("stage ", j, ": ", s.status().message()));
    }
    plan.stages.push_back(*s);
    plan.bottleneck_s = std::max(plan.bottleneck_s, s->estimate.time_s() + s->estimate.aux_head_s);
  }
  plan.predictions = PredictAlgorithms(p, plan, o);
  if (o.algorithm == A::kDelayed && o.max_in_flight == kAutoInFlight && o.in_flight.empty() &&
      J > 1) {
    // max_in_flight: auto: planned again at the depths that cover the round
    // trip at this plan's times (the times do not change with the depth;
    // the memory does).
    PlanOptions deeper = o;
    deeper.ranges = ranges;
    deeper.in_flight = CoveringDepths(p, plan, o);
    absl::StatusOr<Plan> again = MakePlan(p, deeper);
    if (!again.ok()) {
      return absl::Status(again.status().code(), absl::StrCat("algorithm.max_in_flight: auto: ",
                                                              again.status().message()));
    }
    return again;
  }
  return plan;
}

std::vector<int> CoveringDepths(const ModelProfile& p, const Plan& plan, const PlanOptions& o) {
  const int J = static_cast<int>(plan.stages.size());
  std::vector<StageEstimate> e;
  std::vector<StageRole> roles;
  for (const StagePlan& s : plan.stages) {
    e.push_back(s.estimate);
    roles.push_back(s.role);
  }
  const RoundTrips r =
      DecoupledRoundTrips(e, roles, Hops(p, o, plan), o, plan.algorithm == A::kPetra ? 2 : 1);
  std::vector<int> depth(J, 1);
  for (int j = J - 2; j >= 0; --j) {
    // At least two more than the next stage, and the round trip in steps at
    // the floor with every later stage's work counted twice: in the 1F1B
    // order a mini-batch waits up to one operation at each stage it crosses,
    // which is what the natural depth 2(J-1-j)+1 covers on equal stages
    // without latency; the links' latency adds its own steps.
    const double cycle = r.cycle_s[j] + r.later_s[j];
    const double steps = r.floor_s > 0 ? std::ceil(cycle / r.floor_s - 1e-9) : 0;
    depth[j] = std::max(depth[j + 1] + 2, static_cast<int>(std::min(steps, 1e6)));
  }
  return depth;
}

absl::StatusOr<ScheduleChoice> ChooseSchedule(const ModelProfile& p, PlanOptions o) {
  ScheduleChoice best;
  double best_s = 0;
  int64_t best_peak = 0;
  absl::Status last = absl::InvalidArgumentError("no schedule to choose from");
  for (PipelineSchedule s :
       {PipelineSchedule::kOneFOneB, PipelineSchedule::kZbH1, PipelineSchedule::kGpipe}) {
    if (s == PipelineSchedule::kZbH1 && o.modes == BlockModes::kRebuild) continue;
    o.schedule = s;
    absl::StatusOr<Plan> plan = MakePlan(p, o);
    if (!plan.ok()) {
      last = plan.status();
      best.tried.emplace_back(s, -1.0);
      continue;
    }
    // Its own prediction: the schedule's at M micro-batches, or plain
    // backprop for M = 1.
    PredictionKey key;
    if (o.micro_batches > 1) {
      key.schedule = s;
      key.micro_batches = o.micro_batches;
    }
    const Prediction* own = plan->Find(key);
    const double seconds = own != nullptr ? own->seconds_per_batch : -1;
    int64_t peak = 0;
    for (const StagePlan& st : plan->stages) peak = std::max(peak, st.estimate.peak_bytes);
    best.tried.emplace_back(s, seconds);
    const bool first = best.plan.stages.empty();
    const bool faster = seconds < best_s * (1 - 1e-9);
    const bool tie = !faster && seconds <= best_s * (1 + 1e-9);
    if (first || faster || (tie && peak < best_peak)) {
      best.schedule = s;
      best.plan = *std::move(plan);
      best_s = seconds;
      best_peak = peak;
    }
  }
  if (best.plan.stages.empty()) return last;
  return best;
}

std::vector<Prediction> PredictAlgorithms(const ModelProfile& p, const Plan& plan,
                                          const PlanOptions& o) {
  const int J = static_cast<int>(plan.stages.size());
  auto roles = [&](AlgorithmKind algorithm) {
    PlanOptions opt = o;
    opt.algorithm = algorithm;
    opt.num_stages = J;
    std::vector<StageRole> r;
    for (int j = 0; j < J; ++j) r.push_back(RoleOf(opt, j));
    return r;
  };
  auto estimates = [&](AlgorithmKind algorithm) {
    std::vector<StageEstimate> out;
    const auto r = roles(algorithm);
    for (int j = 0; j < J; ++j) {
      const StagePlan& s = plan.stages[j];
      std::vector<bool> store =
          plan.algorithm == algorithm ? s.store : DefaultStore(p, algorithm, s.begin, s.end);
      const ModelProfile& on = ProfileOfStage(p, o, j);
      out.push_back(EstimateStage(on, algorithm, s.begin, s.end, store, r[j]));
      AddLinkTime(on, o, s.begin, s.end, r[j], out.back());
    }
    return out;
  };
  auto slowest = [](const std::vector<StageEstimate>& e, bool aux) {
    double t = 0;
    for (const auto& s : e) t = std::max(t, s.time_s() + (aux ? s.aux_head_s : 0.0));
    return t;
  };
  std::vector<Prediction> out;
  // The exact schedules at the job's micro-batches; for a job of another
  // algorithm at 2J (as far as the batch allows), what a user of 1F1B or
  // ZB-H1 would pick, so that the two kinds are compared on one link.
  const int M = o.algorithm == A::kBackprop || o.algorithm == A::kNwise
                    ? std::max(1, o.micro_batches)
                    : static_cast<int>(std::max<int64_t>(
                          1, std::min<int64_t>(2 * J, p.batch_size > 0 ? p.batch_size : 2 * J)));
  // Each link's message of a whole mini-batch (hop) and the largest of a
  // micro-batch's (what the schedules' simulation charges every message).
  const std::vector<double> hop = Hops(p, o, plan);
  double micro_hop = 0;
  for (int j = 0; j + 1 < J; ++j) {
    micro_hop =
        std::max(micro_hop, HopSeconds(ProfileOfStage(p, o, j), o, plan.stages[j], 1.0 / M));
  }
  const auto bp = estimates(A::kBackprop);
  double t_bp = bp[0].step_s;
  for (const auto& s : bp) t_bp += s.forward_s + s.backward_s + s.message_s;
  for (const double h : hop) t_bp += 2 * h;  // forward and back across every link
  out.push_back(
      {PredictionKey{}, t_bp, 1.0, "sum of stage forward+backward+messages, + stage 0's step"});
  if (M > 1) {
    // Each schedule's own orders played out with the stages' estimated
    // costs per micro-batch (messages with the forward; the backward split
    // half and half into input and weight gradients, the zero-bubble
    // paper's B ~ W), then stage 0's step.
    pipeline::ScheduleOptions so{
        .stages = J, .micro_batches = M, .lookahead = o.lookahead, .link_seconds = micro_hop};
    for (const StageEstimate& s : bp) {
      so.costs.push_back(
          {(s.forward_s + s.message_s) / M, s.backward_s / (2.0 * M), s.backward_s / (2.0 * M)});
    }
    for (PipelineSchedule sched :
         {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB, PipelineSchedule::kZbH1}) {
      if (sched == PipelineSchedule::kZbH1 && o.modes == BlockModes::kRebuild) continue;
      if (o.chunks > 1) break;  // the stages share workers: only interleaved applies
      auto orders = pipeline::StageOrders(sched, so);
      if (!orders.ok()) continue;
      auto sim = pipeline::Simulate(*orders, so);
      if (!sim.ok()) continue;
      out.push_back({PredictionKey{.schedule = sched, .micro_batches = M},
                     sim->seconds + bp[0].step_s, 0,
                     absl::StrFormat("the schedule simulated on the stages' costs (bubble %.0f%%)",
                                     100 * sim->bubble)});
    }
    if (o.chunks > 1 && J % o.chunks == 0) {
      // Interleaved: worker w holds virtual stages w, w + W, ...; its costs
      // are its chunks' (one chunk's operation costs 1/v of them), and each
      // worker's step is its chunks' steps.
      const int W = J / o.chunks;
      pipeline::ScheduleOptions io{
          .stages = W, .micro_batches = M, .chunks = o.chunks, .link_seconds = micro_hop};
      io.costs.assign(W, {0, 0, 0});
      double step = 0;
      for (int s = 0; s < J; ++s) {
        pipeline::StageCosts& c = io.costs[s % W];
        c.forward += (bp[s].forward_s + bp[s].message_s) / M;
        c.backward_input += bp[s].backward_s / (2.0 * M);
        c.backward_weight += bp[s].backward_s / (2.0 * M);
        if (s % W == 0) step += bp[s].step_s;
      }
      auto orders = pipeline::StageOrders(PipelineSchedule::kInterleaved, io);
      auto sim = orders.ok() ? pipeline::Simulate(*orders, io) : orders.status();
      if (sim.ok()) {
        out.push_back(
            {PredictionKey{.schedule = PipelineSchedule::kInterleaved,
                           .micro_batches = M,
                           .chunks = o.chunks},
             sim->seconds + step, 0,
             absl::StrFormat("the schedule simulated on the chunks' costs (bubble %.0f%%)",
                             100 * sim->bubble)});
      }
    }
  }
  // Decoupled: the slowest stage, or a round trip over the in-flight depth
  // where the links' latency does not fit in it (DecoupledSeconds).
  const std::string round_trip =
      o.link_latency_s > 0 || o.link_bytes_per_s > 0 ? ", or round trip / in-flight depth" : "";
  for (const auto& [a, how] : std::vector<std::pair<AlgorithmKind, std::string>>{
           {A::kDelayed, o.forward_once ? "slowest stage: forward keeping its graph + backward + "
                                          "step (forward: once)"
                                        : "slowest stage: graph-free forward + recompute + "
                                          "backward + step"},
           {A::kPetra, "slowest stage: graph-free forward + rebuild/recompute backward + step"},
           {A::kFeaturesReplay, "slowest stage: forward + replay forward + backward + step"}}) {
    const std::vector<StageRole> r = roles(a);
    const double t = DecoupledSeconds(estimates(a), r, hop, o, a == A::kPetra ? 2 : 1);
    Prediction pr{PredictionKey{.algorithm = a}, t, 0, how + round_trip};
    pr.staleness = J > 1 ? std::max(0, r[0].inflight - 1) : 0;
    out.push_back(std::move(pr));
  }
  const auto nw = estimates(A::kNwise);
  std::vector<int> ns;
  if (o.nwise_n > 0) {
    ns.push_back(o.nwise_n);
  } else {
    for (int k = 1; k <= std::min(2, J); ++k) ns.push_back(k);
  }
  for (int k : ns) {
    const int M = std::max(1, o.micro_batches);
    double t;
    std::string how;
    if (k >= J) {
      t = t_bp;
      how = "n = J is backprop";
    } else {
      auto slots = timing::InterlockSlots(J, M, k);
      t = (slots.ok() ? *slots : 2.0 * k * M) * slowest(nw, true) / (2.0 * M);
      how = p.aux_head.empty()
                ? "T(A,M,N) slots x half the slowest stage (forward+backward+step; aux head "
                  "not profiled)"
                : "T(A,M,N) slots x half the slowest stage (forward+backward+aux head+step)";
    }
    out.push_back({PredictionKey{.algorithm = A::kNwise, .nwise_n = k}, t, 0, how});
  }
  for (auto& pr : out) pr.speedup = pr.seconds_per_batch > 0 ? t_bp / pr.seconds_per_batch : 0;
  return out;
}

PlanOptions PlanOptionsForJob(const JobSpec& spec, const std::vector<std::pair<int, int>>& ranges) {
  PlanOptions o;
  o.num_stages = VirtualStages(spec.stages);  // interleaved: the virtual stages
  o.chunks = std::max(1, spec.stages.chunks_per_worker);
  // A copy: Phases() returns a temporary (a reference into it dangled; found
  // by the AddressSanitizer run, scripts/test --sanitize).
  const AlgorithmSpec a = Phases(spec).front().algorithm;
  o.algorithm = a.kind();
  o.modes = spec.stages.modes;
  if (spec.stages.memory_budget > 0) o.memory_caps = {spec.stages.memory_budget};
  if (const auto* backprop = a.get_if<BackpropOptions>()) {
    o.micro_batches = backprop->micro_batches;
    o.schedule = backprop->schedule;
    o.lookahead = backprop->lookahead;
  } else if (const auto* nwise = a.get_if<NwiseOptions>()) {
    o.micro_batches = nwise->micro_batches;
    o.nwise_n = nwise->n;
  } else if (const auto* delayed = a.get_if<DelayedOptions>()) {
    o.stash_weights = delayed->weights == DelayedWeights::kStash;
    o.predict_weights = delayed->predict_weights;
    o.forward_once = delayed->forward_once();
    o.max_in_flight = delayed->max_in_flight;
  } else if (const auto* petra = a.get_if<PetraOptions>()) {
    o.predict_weights = petra->predict_weights;
  }
  if (spec.stages.partition != Partition::kAuto) o.ranges = ranges;
  o.link_bytes_per_s = spec.placement.link_gbps * 1e9 / 8;
  o.link_latency_s = spec.placement.link_rtt_ms / 2000;
  o.forward_wire = spec.transport.forward;
  o.backward_wire = spec.transport.backward;
  return o;
}

absl::StatusOr<int64_t> ParseBytes(const std::string& text) { return ParseByteSize(text); }

}  // namespace stagewise::planner
