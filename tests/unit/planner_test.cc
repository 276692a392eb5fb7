// The planner's dynamic programs against brute force, and its plans against
// their caps (docs/planner.md).
#include "services/planner/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "services/planner/knapsack.h"
#include "services/planner/partition.h"
#include "services/planner/plan_proto.h"
#include "services/planner/profile.h"
#include "services/spec/job_spec.h"

namespace stagewise::planner {
namespace {

// Best value of the chain problem over all 2^n choices (-1: none feasible).
double BruteChain(const std::vector<ChainItem>& items, int64_t capacity) {
  const int n = static_cast<int>(items.size());
  double best = -1;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    int64_t w = 0;
    double v = 0;
    bool ok = true;
    for (int i = 0; i < n; ++i) {
      const bool x = mask >> i & 1;
      if (items[i].forced && !x) ok = false;
      if (x) w += items[i].weight, v += items[i].value;
      if (i >= 1 && (x || (mask >> (i - 1) & 1))) w += items[i].boundary;
    }
    if (ok && w <= capacity) best = std::max(best, v);
  }
  return best;
}

// What a choice costs under the chain rules.
int64_t ChainWeight(const std::vector<ChainItem>& items, const std::vector<bool>& x) {
  int64_t w = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (x[i]) w += items[i].weight;
    if (i >= 1 && (x[i] || x[i - 1])) w += items[i].boundary;
  }
  return w;
}

TEST(Knapsack, Knapsack01EqualsBruteForceOnRandomInstances) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 16;
    std::vector<KnapsackItem> items(n);
    int64_t total = 0;
    for (auto& it : items) {
      it.value = std::uniform_real_distribution<double>(0, 10)(rng);
      it.weight = std::uniform_int_distribution<int64_t>(0, 40)(rng);
      total += it.weight;
    }
    const int64_t capacity = std::uniform_int_distribution<int64_t>(0, total)(rng);
    KnapsackResult r = Knapsack01(items, capacity);
    double best = 0;
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      int64_t w = 0;
      double v = 0;
      for (int i = 0; i < n; ++i) {
        if (mask >> i & 1) w += items[i].weight, v += items[i].value;
      }
      if (w <= capacity) best = std::max(best, v);
    }
    ASSERT_NEAR(r.value, best, 1e-9) << "trial " << trial << ", n=" << n;
    // The backtracked choice is feasible and worth the optimum.
    int64_t w = 0;
    double v = 0;
    for (int i = 0; i < n; ++i) {
      if (r.chosen[i]) w += items[i].weight, v += items[i].value;
    }
    EXPECT_LE(w, capacity);
    EXPECT_EQ(w, r.weight);
    EXPECT_NEAR(v, best, 1e-9);
  }
}

TEST(Knapsack, ChainKnapsackEqualsBruteForceOnRandomInstances) {
  std::mt19937 rng(11);
  int infeasible = 0, mixed = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + trial % 16;
    std::vector<ChainItem> items(n);
    int64_t total = 0;
    for (auto& it : items) {
      it.value = std::uniform_real_distribution<double>(0, 10)(rng);
      it.weight = std::uniform_int_distribution<int64_t>(0, 30)(rng);
      it.boundary = trial % 4 == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, 20)(rng);
      it.forced = std::uniform_int_distribution<int>(0, 5)(rng) == 0;
      total += it.weight + it.boundary;
    }
    const int64_t capacity = std::uniform_int_distribution<int64_t>(0, total)(rng);
    const double best = BruteChain(items, capacity);
    KnapsackResult r = ChainKnapsack(items, capacity);
    ASSERT_NEAR(r.value, best, 1e-9) << "trial " << trial << ", n=" << n;
    if (best < 0) {
      ++infeasible;
      EXPECT_TRUE(r.chosen.empty());
      continue;
    }
    ASSERT_EQ(r.chosen.size(), items.size());
    EXPECT_LE(ChainWeight(items, r.chosen), capacity);
    EXPECT_EQ(ChainWeight(items, r.chosen), r.weight);
    double v = 0;
    int stored = 0;
    for (int i = 0; i < n; ++i) {
      if (items[i].forced) {
        EXPECT_TRUE(r.chosen[i]) << "forced block " << i;
      }
      if (r.chosen[i]) v += items[i].value, ++stored;
    }
    EXPECT_NEAR(v, best, 1e-9);
    if (stored > 0 && stored < n) ++mixed;
  }
  // The instances exercise both outcomes.
  EXPECT_GT(infeasible, 0);
  EXPECT_GT(mixed, 100);
}

TEST(Knapsack, ChainWithoutBoundariesIsKnapsack01) {
  std::vector<ChainItem> chain = {{5, 4, 0, false}, {4, 3, 0, false}, {3, 2, 0, false}};
  std::vector<KnapsackItem> plain = {{5, 4}, {4, 3}, {3, 2}};
  for (int64_t c = 0; c <= 9; ++c) {
    EXPECT_DOUBLE_EQ(ChainKnapsack(chain, c).value, Knapsack01(plain, c).value) << c;
  }
  // Capacity 5: {4, 3} -> 7 beats {5} alone.
  EXPECT_EQ(Knapsack01(plain, 5).chosen, (std::vector<bool>{false, true, true}));
}

TEST(Knapsack, UnitsRoundWeightsUpAndCapacityDown) {
  EXPECT_EQ(WeightUnits(1, 1024), 1);
  EXPECT_EQ(WeightUnits(1024, 1024), 1);
  EXPECT_EQ(WeightUnits(1025, 1024), 2);
  EXPECT_EQ(CapacityUnits(2047, 1024), 1);
  EXPECT_EQ(WeightUnits(0, 7), 0);
}

TEST(Partition, MinMaxEqualsBruteForceOnSmallCases) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + trial % 9;
    const int J = 1 + trial % std::min(n, 4);
    std::vector<double> t(n);
    for (auto& v : t) v = std::uniform_real_distribution<double>(0.1, 5)(rng);
    // Per-worker caps on the number of blocks (a memory cap in miniature).
    std::vector<int> cap(J);
    for (auto& c : cap) c = std::uniform_int_distribution<int>(1, n)(rng);
    auto cost = [&](int b, int e, int j) {
      if (e - b > cap[j]) return std::numeric_limits<double>::infinity();
      double s = 0;
      for (int i = b; i < e; ++i) s += t[i] * (1.0 + 0.1 * j);  // workers differ in speed
      return s;
    };
    // Brute force over the J-1 cut points.
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cuts(J + 1);
    std::function<void(int, int)> rec = [&](int j, int begin) {
      if (j == J - 1) {
        const double c = cost(begin, n, j);
        double worst = c;
        int b = 0;
        for (int k = 0; k < J - 1; ++k) worst = std::max(worst, cost(cuts[k], cuts[k + 1], k)), b++;
        best = std::min(best, worst);
        return;
      }
      for (int e = begin + 1; e <= n - (J - 1 - j); ++e) {
        cuts[j] = begin;
        cuts[j + 1] = e;
        rec(j + 1, e);
      }
    };
    rec(0, 0);
    PartitionResult r = MinMaxPartition(n, J, cost);
    if (best == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(r.feasible) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(r.feasible) << "trial " << trial;
    EXPECT_NEAR(r.bottleneck, best, 1e-9) << "trial " << trial;
    ASSERT_EQ(static_cast<int>(r.ranges.size()), J);
    EXPECT_EQ(r.ranges.front().first, 0);
    EXPECT_EQ(r.ranges.back().second, n);
    double worst = 0;
    for (int j = 0; j < J; ++j) {
      EXPECT_LT(r.ranges[j].first, r.ranges[j].second);
      if (j > 0) {
        EXPECT_EQ(r.ranges[j].first, r.ranges[j - 1].second);
      }
      worst = std::max(worst, cost(r.ranges[j].first, r.ranges[j].second, j));
    }
    EXPECT_NEAR(worst, r.bottleneck, 1e-9);
  }
}

// A synthetic RevNet-like profile: stem, reversible blocks, a head.
ModelProfile SyntheticProfile(int reversible, std::mt19937& rng) {
  ModelProfile p;
  p.model = "synthetic";
  p.batch_size = 32;
  p.label_bytes = 256;
  auto block = [&](int index, const char* kind, bool rev) {
    BlockProfile b;
    b.index = index;
    b.kind = kind;
    b.reversible = rev;
    std::uniform_real_distribution<double> t(1e-3, 5e-3);
    b.forward_s = t(rng);
    b.forward_nograd_s = b.forward_s * 0.9;
    b.backward_s = 2 * t(rng);
    b.rebuild_backward_s = b.backward_s + b.forward_s;
    b.step_s = 1e-4;
    b.message_s = 2e-4;
    b.input_bytes = b.output_bytes = 1 << 20;
    b.graph_bytes = std::uniform_int_distribution<int64_t>(2 << 20, 6 << 20)(rng);
    b.backward_transient_bytes = 2 << 20;
    b.rebuild_transient_bytes = 3 << 20;
    b.forward_transient_bytes = 1 << 20;
    b.parameter_bytes = b.optimizer_bytes = 1 << 16;
    return b;
  };
  p.blocks.push_back(block(0, "stem", false));
  for (int i = 0; i < reversible; ++i) p.blocks.push_back(block(i + 1, "reversible", true));
  p.blocks.push_back(block(reversible + 1, "head", false));
  p.blocks.back().output_bytes = 32 * 10 * 4;
  return p;
}

TEST(Planner, PlansRespectEveryCapAndMixModesInBetween) {
  std::mt19937 rng(5);
  for (AlgorithmKind algorithm : {AlgorithmKind::kBackprop, AlgorithmKind::kPetra}) {
    ModelProfile p = SyntheticProfile(8, rng);
    PlanOptions o;
    o.num_stages = 2;
    o.algorithm = algorithm;
    o.modes = BlockModes::kRebuild;
    auto low = MakePlan(p, o);
    ASSERT_TRUE(low.ok()) << low.status();
    o.modes = BlockModes::kStore;
    auto high = MakePlan(p, o);
    ASSERT_TRUE(high.ok()) << high.status();
    int64_t lo = 0, hi = 0;
    for (const auto& s : low->stages) lo = std::max(lo, s.estimate.peak_bytes);
    for (const auto& s : high->stages) hi = std::max(hi, s.estimate.peak_bytes);
    ASSERT_LT(lo, hi) << NameOf(algorithm);
    o.modes = BlockModes::kAuto;
    int mixed = 0;
    for (int k = 0; k <= 10; ++k) {
      const int64_t cap = lo + (hi - lo) * k / 10;
      o.memory_caps = {cap};
      auto plan = MakePlan(p, o);
      ASSERT_TRUE(plan.ok()) << NameOf(algorithm) << " cap " << cap << ": " << plan.status();
      int stored = 0, rebuilt = 0;
      for (const auto& s : plan->stages) {
        EXPECT_LE(s.estimate.peak_bytes, cap)
            << NameOf(algorithm) << " stage [" << s.begin << "," << s.end << ")";
        for (int i = s.begin; i < s.end; ++i) {
          if (!p.blocks[i].reversible) {
            EXPECT_TRUE(s.store[i - s.begin]);
          } else {
            (s.store[i - s.begin] ? stored : rebuilt)++;
          }
        }
      }
      if (stored > 0 && rebuilt > 0) ++mixed;
    }
    EXPECT_GT(mixed, 0) << NameOf(algorithm);
    // Below the all-rebuild figure nothing fits, and the error says so.
    o.memory_caps = {lo / 2};
    auto none = MakePlan(p, o);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  }
}

TEST(Planner, AutoModesAreTheFastestChoiceUnderTheCap) {
  // Brute force over every store/rebuild choice of one stage: the planner's
  // pick is feasible and no feasible choice is faster (by the same estimate).
  std::mt19937 rng(9);
  ModelProfile p = SyntheticProfile(6, rng);
  const int n = static_cast<int>(p.blocks.size());
  StageRole role{true, true, 1};
  PlanOptions o;
  o.algorithm = AlgorithmKind::kBackprop;
  std::vector<bool> all(n, true), none(n, true);
  for (int i = 1; i < n - 1; ++i) none[i] = false;
  const int64_t lo = EstimateStage(p, AlgorithmKind::kBackprop, 0, n, none, role).peak_bytes;
  const int64_t hi = EstimateStage(p, AlgorithmKind::kBackprop, 0, n, all, role).peak_bytes;
  for (int k = 1; k < 8; ++k) {
    const int64_t cap = lo + (hi - lo) * k / 8;
    auto sp = PlanStage(p, o, 0, n, role, cap);
    ASSERT_TRUE(sp.ok()) << sp.status();
    EXPECT_LE(sp->estimate.peak_bytes, cap);
    double best = std::numeric_limits<double>::infinity();
    for (uint32_t mask = 0; mask < (1u << (n - 2)); ++mask) {
      std::vector<bool> x(n, true);
      for (int i = 1; i < n - 1; ++i) x[i] = mask >> (i - 1) & 1;
      const StageEstimate e = EstimateStage(p, AlgorithmKind::kBackprop, 0, n, x, role);
      if (e.peak_bytes <= cap) best = std::min(best, e.time_s());
    }
    // The knapsack works on kept bytes with a safety margin for transients,
    // so it may leave a little on the table, never exceed the cap.
    EXPECT_LE(sp->estimate.time_s(), best * 1.10) << "cap " << cap;
  }
}

TEST(Planner, AutoPartitionBalancesTheSlowestStage) {
  std::mt19937 rng(1);
  ModelProfile p = SyntheticProfile(10, rng);
  PlanOptions o;
  o.num_stages = 3;
  o.algorithm = AlgorithmKind::kDelayed;
  auto plan = MakePlan(p, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // No even split is better than the DP's.
  o.ranges = {{0, 4}, {4, 8}, {8, 12}};
  auto even = MakePlan(p, o);
  ASSERT_TRUE(even.ok());
  EXPECT_LE(plan->bottleneck_s, even->bottleneck_s + 1e-12);
  // Predictions: backprop is the reference.
  ASSERT_FALSE(plan->predictions.empty());
  EXPECT_EQ(plan->predictions[0].label(), "backprop");
  EXPECT_EQ(plan->predictions[0].key, PredictionKey{});
  EXPECT_DOUBLE_EQ(plan->predictions[0].speedup, 1.0);
  EXPECT_FALSE(PlanText(p, *plan).empty());
  EXPECT_NE(PlanJson(p, *plan).find("\"predictions\""), std::string::npos);
}

// placement.per_worker_profiles: stage j is planned on the profile of its
// worker. With stage 1's worker half as fast (every time doubled) the DP
// gives it less of the model than the one profile does, its bottleneck on
// those times is no worse than the speed-blind cut's, and the worker count
// of profiles must match the stages.
TEST(Planner, EachStageIsPlannedOnItsWorkersTimes) {
  std::mt19937 rng(3);
  const ModelProfile p = SyntheticProfile(10, rng);
  ModelProfile slow = p;
  for (BlockProfile& b : slow.blocks) {
    for (double* t : {&b.forward_s, &b.forward_nograd_s, &b.backward_s, &b.rebuild_backward_s,
                      &b.inverse_s, &b.step_s, &b.message_s, &b.aux_head_s}) {
      *t *= 2;
    }
  }
  PlanOptions o;
  o.num_stages = 2;
  auto blind = MakePlan(p, o);
  ASSERT_TRUE(blind.ok()) << blind.status();
  o.stage_profiles = {p, slow};
  auto aware = MakePlan(p, o);
  ASSERT_TRUE(aware.ok()) << aware.status();
  auto blocks = [](const StagePlan& s) { return s.end - s.begin; };
  EXPECT_LT(blocks(aware->stages[1]), blocks(blind->stages[1]));
  EXPECT_GT(blocks(aware->stages[0]), blocks(blind->stages[0]));
  // The speed-blind cut on the real (per-worker) times is no better.
  o.ranges = {{blind->stages[0].begin, blind->stages[0].end},
              {blind->stages[1].begin, blind->stages[1].end}};
  auto blind_on_real = MakePlan(p, o);
  ASSERT_TRUE(blind_on_real.ok()) << blind_on_real.status();
  EXPECT_LE(aware->bottleneck_s, blind_on_real->bottleneck_s + 1e-12);
  EXPECT_GT(blind_on_real->bottleneck_s, blind->bottleneck_s);
  o.ranges.clear();
  o.stage_profiles = {p};
  EXPECT_TRUE(absl::IsInvalidArgument(MakePlan(p, o).status()));
}

// `n` linear blocks of 1 ms forward and 2 ms backward, each taking and
// giving `bytes`.
ModelProfile ChainProfile(int n, int64_t bytes) {
  ModelProfile p;
  p.model = "chain";
  p.batch_size = 32;
  for (int i = 0; i < n; ++i) {
    BlockProfile b;
    b.index = i;
    b.kind = "linear";
    b.forward_s = b.forward_nograd_s = 1e-3;
    b.backward_s = b.rebuild_backward_s = 2e-3;
    b.input_bytes = b.output_bytes = bytes;
    p.blocks.push_back(b);
  }
  return p;
}

// placement.link_gbps: sending counts in the sender's time, so over a slow
// link the cut moves off the boundary with the large activation.
TEST(Planner, ASlowLinkMovesTheCutOffALargeActivation) {
  ModelProfile p = ChainProfile(6, 1 << 10);
  p.blocks[2].output_bytes = p.blocks[3].input_bytes = 64 << 20;
  PlanOptions o;
  o.num_stages = 2;
  auto blind = MakePlan(p, o);
  ASSERT_TRUE(blind.ok()) << blind.status();
  ASSERT_EQ(blind->stages[0].end, 3);  // equal halves: the 64 MiB boundary
  EXPECT_EQ(blind->stages[0].estimate.link_s, 0);
  o.link_bytes_per_s = 1e9 / 8;  // 1 Gbit/s
  o.link_latency_s = 1e-4;
  auto aware = MakePlan(p, o);
  ASSERT_TRUE(aware.ok()) << aware.status();
  EXPECT_NE(aware->stages[0].end, 3);
  // Stage 0 sends its output and stage 1 its input's gradient, each 1 KiB.
  EXPECT_NEAR(aware->stages[0].estimate.link_s, 1e-4 + 1024 / 1.25e8, 1e-9);
  EXPECT_NEAR(aware->stages[1].estimate.link_s, 1e-4 + 1024 / 1.25e8, 1e-9);
  o.ranges = {{0, 3}, {3, 6}};
  auto blind_on_link = MakePlan(p, o);
  ASSERT_TRUE(blind_on_link.ok()) << blind_on_link.status();
  EXPECT_GT(blind_on_link->bottleneck_s, 0.5);  // 64 MiB at 125 MB/s
  EXPECT_LT(aware->bottleneck_s, 0.1);
  EXPECT_NE(PlanText(p, *aware).find("sending over the links"), std::string::npos);
}

// placement.link_rtt_ms: a flushing schedule pays the links' latency in its
// fill and drain (and in every round trip its in-flight micro-batches do not
// cover), a decoupled pipeline once per round trip over its in-flight depth.
// The prediction is the formula of DecoupledSeconds, computed here from the
// stages' times; and the text names the faster of the two kinds.
TEST(Planner, LinkLatencyIsPaidPerRoundTripNotPerStepByADecoupledPipeline) {
  const ModelProfile p = ChainProfile(8, 1 << 10);  // 1 ms forward, 2 ms backward a block
  PlanOptions o;
  o.num_stages = 4;
  o.algorithm = AlgorithmKind::kBackprop;
  o.micro_batches = 8;
  o.schedule = PipelineSchedule::kOneFOneB;
  o.ranges = {{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  auto near = MakePlan(p, o);
  ASSERT_TRUE(near.ok()) << near.status();
  const PredictionKey one_f_one_b{.schedule = PipelineSchedule::kOneFOneB, .micro_batches = 8};
  const PredictionKey delayed{.algorithm = AlgorithmKind::kDelayed};
  ASSERT_NE(near->Find(one_f_one_b), nullptr);
  ASSERT_NE(near->Find(delayed), nullptr);
  // No latency: 1F1B's bubble, and delayed at its slowest stage (forward: once).
  EXPECT_NEAR(near->Find(one_f_one_b)->seconds_per_batch, (8 + 3) / 8.0 * 6e-3, 1e-9);
  EXPECT_NEAR(near->Find(delayed)->seconds_per_batch, 6e-3, 1e-9);
  EXPECT_EQ(near->Find(delayed)->staleness, 6);
  EXPECT_EQ(near->Find(one_f_one_b)->staleness, 0);

  const double L = 0.025;
  o.link_latency_s = L;  // link_rtt_ms: 50
  auto far = MakePlan(p, o);
  ASSERT_TRUE(far.ok()) << far.status();
  const double exact = far->Find(one_f_one_b)->seconds_per_batch;
  EXPECT_GE(exact, (8 + 3) / 8.0 * 6e-3 + 2 * 3 * L) << "fill and drain: 2(J-1) latencies";
  // Stage j holds d_j = 2(J-1-j)+1 mini-batches per round trip of the later
  // stages' work (6 ms each) and two latencies per link on the way.
  double want = 6e-3;
  for (int j = 0; j < 3; ++j) {
    const double round_trip = (3 - j) * 6e-3 + 2 * (3 - j) * L;
    want = std::max(want, (round_trip + 6e-3) / (2 * (3 - j) + 1));
  }
  EXPECT_NEAR(far->Find(delayed)->seconds_per_batch, want, 1e-9);
  EXPECT_LT(far->Find(delayed)->seconds_per_batch * 4, exact);
  const std::string text = PlanText(p, *far);
  EXPECT_NE(text.find("fastest exact: backprop"), std::string::npos) << text;
  EXPECT_NE(text.find("fastest decoupled: "), std::string::npos) << text;
  EXPECT_NE(text.find("faster per mini-batch (staleness may cost quality"), std::string::npos)
      << text;
  // Plain backprop pays two latencies per link on every mini-batch.
  const double plain = far->Find(PredictionKey{})->seconds_per_batch;
  EXPECT_NEAR(plain - near->Find(PredictionKey{})->seconds_per_batch, 2 * 3 * L, 1e-9);
}

// delayed's max_in_flight: auto: each stage keeps enough mini-batches in
// flight that its round trip takes no longer than that many steps at the
// slowest stage's time, never fewer than the natural depth; the pipeline then
// runs at its slowest stage whatever the latency, the memory is planned at
// those depths (a cap that does not hold them names the key), and the plan
// shows the depths.
TEST(Planner, MaxInFlightAutoCoversTheRoundTrip) {
  ModelProfile p = ChainProfile(8, 1 << 10);  // 6 ms of work per stage of two blocks
  for (BlockProfile& b : p.blocks) {
    b.graph_bytes = 1 << 20;  // what each mini-batch in flight keeps
    b.parameter_bytes = 1 << 16;
  }
  PlanOptions o;
  o.num_stages = 4;
  o.algorithm = AlgorithmKind::kDelayed;
  o.ranges = {{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  o.max_in_flight = kAutoInFlight;
  const PredictionKey delayed{.algorithm = AlgorithmKind::kDelayed};
  // No latency: the natural depths, 7 5 3 1.
  auto near = MakePlan(p, o);
  ASSERT_TRUE(near.ok()) << near.status();
  std::vector<int> depth;
  for (const StagePlan& s : near->stages) depth.push_back(s.role.inflight);
  EXPECT_EQ(depth, (std::vector<int>{7, 5, 3, 1}));

  const double L = 0.025;
  o.link_latency_s = L;
  auto far = MakePlan(p, o);
  ASSERT_TRUE(far.ok()) << far.status();
  depth.clear();
  for (const StagePlan& s : far->stages) depth.push_back(s.role.inflight);
  for (int j = 0; j < 3; ++j) {
    // (2 W_j + H_j + c_j) / T: the later stages' work twice, two latencies
    // per link, its own.
    const double cycle = 2 * (3 - j) * 6e-3 + 2 * (3 - j) * L + 6e-3;
    EXPECT_EQ(depth[j],
              std::max(depth[j + 1] + 2, static_cast<int>(std::ceil(cycle / 6e-3 - 1e-9))))
        << "stage " << j;
  }
  EXPECT_EQ(depth[0], 32);  // (2 x 3 x 6 + 6 x 25 + 6) / 6
  EXPECT_EQ(depth[3], 1);
  EXPECT_NEAR(far->Find(delayed)->seconds_per_batch, 6e-3, 1e-9);
  EXPECT_EQ(far->Find(delayed)->staleness, depth[0] - 1);
  // The natural depth pays the latency.
  o.max_in_flight = 0;
  auto natural = MakePlan(p, o);
  ASSERT_TRUE(natural.ok()) << natural.status();
  EXPECT_GT(natural->Find(delayed)->seconds_per_batch, 2 * 6e-3);
  // The deeper pipeline keeps a graph per mini-batch in flight: its memory.
  EXPECT_GT(far->stages[0].estimate.peak_bytes, natural->stages[0].estimate.peak_bytes);
  o.max_in_flight = kAutoInFlight;
  o.memory_caps = {(natural->stages[0].estimate.peak_bytes + far->stages[0].estimate.peak_bytes) /
                   2};
  auto capped = MakePlan(p, o);
  ASSERT_FALSE(capped.ok());
  EXPECT_NE(capped.status().message().find("algorithm.max_in_flight: auto"), std::string::npos)
      << capped.status();
  o.memory_caps.clear();
  const std::string text = PlanText(p, *far);
  EXPECT_NE(text.find("mini-batches in flight (algorithm.max_in_flight; staleness = in flight - "
                      "1): stage 0 32, "),
            std::string::npos)
      << text;
  bool summarized = false;
  for (const auto& [key, value] : PlanSummary(*far)) {
    if (key == "plan.stage0.in_flight") summarized = value == 32;
  }
  EXPECT_TRUE(summarized);
}

// transport's formats shrink what crosses the links: a stage's link time is
// its messages' bytes times the format's ratio (PETRA's backward carries two
// tensors), and PlanText says which ratios it used.
TEST(Planner, TheWireFormatScalesTheLinkTime) {
  WireFormatSpec f;
  EXPECT_EQ(WireBytesRatio(f), 1.0);
  f.compression = Compression::kBf16;
  EXPECT_EQ(WireBytesRatio(f), 0.5);
  f.compression = Compression::kInt8;
  f.block = 64;
  EXPECT_EQ(WireBytesRatio(f), 0.25 + 1.0 / 64);
  f.compression = Compression::kInt4;
  f.block = 128;
  EXPECT_EQ(WireBytesRatio(f), 0.125 + 1.0 / 128);

  const ModelProfile p = ChainProfile(4, 8 << 20);
  PlanOptions o;
  o.num_stages = 2;
  o.ranges = {{0, 2}, {2, 4}};
  o.link_bytes_per_s = 1e9 / 8;
  auto fp32 = MakePlan(p, o);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  const double bytes_s = (8 << 20) / 1.25e8;
  EXPECT_NEAR(fp32->stages[0].estimate.link_s, bytes_s, 1e-9);
  EXPECT_NEAR(fp32->stages[1].estimate.link_s, bytes_s, 1e-9);
  o.forward_wire.compression = Compression::kInt8;
  o.forward_wire.block = 64;
  o.backward_wire.compression = Compression::kInt4;
  o.backward_wire.block = 128;
  auto narrow = MakePlan(p, o);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_NEAR(narrow->stages[0].estimate.link_s, (0.25 + 1.0 / 64) * bytes_s, 1e-9);
  EXPECT_NEAR(narrow->stages[1].estimate.link_s, (0.125 + 1.0 / 128) * bytes_s, 1e-9);
  EXPECT_LT(narrow->bottleneck_s, fp32->bottleneck_s);
  EXPECT_NE(PlanText(p, *narrow)
                .find("wire formats (transport.compression): stage 0 forward "
                      "int8; stage 1 backward int4"),
            std::string::npos)
      << PlanText(p, *narrow);
  EXPECT_EQ(PlanText(p, *fp32).find("wire formats"), std::string::npos);  // all float32
  o.algorithm = AlgorithmKind::kPetra;
  auto petra = MakePlan(p, o);
  ASSERT_TRUE(petra.ok()) << petra.status();
  EXPECT_NEAR(petra->stages[1].estimate.link_s, 2 * (0.125 + 1.0 / 128) * bytes_s, 1e-9);

  // A job's transport section sets them, per direction.
  auto spec = ParseJobSpec(
      "name: w\nmodel: {name: mlp}\ndata: {dataset: synthetic}\nstages: 2\nsteps: 1\n"
      "placement: {link_gbps: 1}\n"
      "transport: {compression: int8, backward: {compression: int4, block: 32}}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const PlanOptions from_job = PlanOptionsForJob(*spec, {{0, 1}, {1, 2}});
  EXPECT_EQ(WireBytesRatio(from_job.forward_wire), 0.25 + 1.0 / 64);
  EXPECT_EQ(WireBytesRatio(from_job.backward_wire), 0.125 + 1.0 / 32);
  EXPECT_EQ(from_job.link_bytes_per_s, 1.25e8);
}

// transport's compression: auto: each stage sends with the least lossy
// format whose link time fits under its compute (its own, so two stages of
// one job may choose differently), int4 when none does; PETRA's backward
// counts its two tensors; no link modelled: none.
TEST(Planner, CompressionAutoPicksTheLeastLossyFormatThatFitsUnderTheCompute) {
  ModelProfile p = ChainProfile(4, 1 << 20);
  for (int i = 2; i < 4; ++i) {  // stage 1 (blocks 2, 3) computes twice as long as stage 0
    BlockProfile& b = p.blocks[i];
    b.forward_s = b.forward_nograd_s = 2e-3;
    b.backward_s = b.rebuild_backward_s = 4e-3;
  }
  PlanOptions o;
  o.num_stages = 2;
  o.ranges = {{0, 2}, {2, 4}};
  o.forward_wire.compression = o.backward_wire.compression = Compression::kAuto;
  const double compute0 = 2 * 3e-3, compute1 = 2 * 6e-3;  // forward + backward of two blocks
  // 1 MiB messages; float32 takes `f32` seconds on the link.
  auto at = [&](double f32) {
    o.link_bytes_per_s = (1 << 20) / f32;
    absl::StatusOr<Plan> plan = MakePlan(p, o);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? std::make_pair(plan->stages[0].estimate.forward_wire,
                                      plan->stages[1].estimate.backward_wire)
                     : std::make_pair(Compression::kAuto, Compression::kAuto);
  };
  using C = Compression;
  EXPECT_EQ(at(0.9 * compute0), std::make_pair(C::kNone, C::kNone));
  // Over stage 0's compute, under stage 1's: stage 0 halves, stage 1 stays float32.
  EXPECT_EQ(at(1.5 * compute0), std::make_pair(C::kBf16, C::kNone));
  EXPECT_EQ(at(3 * compute0), std::make_pair(C::kInt8, C::kBf16));
  EXPECT_EQ(at(5 * compute0), std::make_pair(C::kInt4, C::kInt8));
  EXPECT_EQ(at(100 * compute0), std::make_pair(C::kInt4, C::kInt4));  // nothing fits
  EXPECT_GT(compute1, compute0);
  o.link_bytes_per_s = (1 << 20) / (1.5 * compute0);
  absl::StatusOr<Plan> plan = MakePlan(p, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Its link time is the chosen format's.
  EXPECT_NEAR(plan->stages[0].estimate.link_s, 0.5 * 1.5 * compute0, 1e-9);
  const std::string text = PlanText(p, *plan);
  EXPECT_NE(text.find("wire formats (transport.compression: auto, the least lossy whose link "
                      "time fits under the stage's compute): stage 0 forward bf16; stage 1 "
                      "backward none"),
            std::string::npos)
      << text;
  EXPECT_NE(PlanJson(p, *plan).find("\"forward_wire\": \"bf16\""), std::string::npos);
  // A fixed direction stays as the job says.
  o.backward_wire.compression = Compression::kFp16;
  plan = MakePlan(p, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[1].estimate.backward_wire, C::kFp16);
  // PETRA's backward sends two tensors: where backprop's stage 1 sent
  // float32 (9 ms under 12), PETRA's halves them (2 x 9 ms does not fit).
  o.backward_wire.compression = Compression::kAuto;
  o.algorithm = AlgorithmKind::kPetra;
  plan = MakePlan(p, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[1].estimate.backward_wire, C::kBf16);
  // No link modelled: nothing to fit under, float32.
  o.link_bytes_per_s = 0;
  plan = MakePlan(p, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[0].estimate.forward_wire, C::kNone);
  // A link's latency is paid whatever the format: a fast link 25 ms away
  // (far over the compute) stays float32, a slow one narrows as without it.
  o.algorithm = AlgorithmKind::kBackprop;
  o.link_latency_s = 0.025;
  EXPECT_EQ(at(0.9 * compute0), std::make_pair(C::kNone, C::kNone));
  EXPECT_EQ(at(1.5 * compute0), std::make_pair(C::kBf16, C::kNone));
  EXPECT_EQ(at(100 * compute0), std::make_pair(C::kInt4, C::kInt4));
}

// A middle stage sends both ways through its one link: each message alone
// would fit under its compute in float32, the two together do not, so it
// sends bf16 both ways while the end stages (one message each) keep float32.
TEST(Planner, CompressionAutoCountsBothDirectionsOfAMiddleStage) {
  const ModelProfile p = ChainProfile(6, 1 << 20);  // 6 ms of compute per stage of two blocks
  PlanOptions o;
  o.num_stages = 3;
  o.ranges = {{0, 2}, {2, 4}, {4, 6}};
  o.forward_wire.compression = o.backward_wire.compression = Compression::kAuto;
  o.link_bytes_per_s = (1 << 20) / 3.6e-3;  // 3.6 ms per float32 message
  absl::StatusOr<Plan> plan = MakePlan(p, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[0].estimate.forward_wire, Compression::kNone);
  EXPECT_EQ(plan->stages[1].estimate.backward_wire, Compression::kBf16);
  EXPECT_EQ(plan->stages[1].estimate.forward_wire, Compression::kBf16);
  EXPECT_NEAR(plan->stages[1].estimate.link_s, 3.6e-3, 1e-9);  // two halves
  EXPECT_EQ(plan->stages[2].estimate.backward_wire, Compression::kNone);
  EXPECT_DOUBLE_EQ(LinkSeconds({1 << 20, 1 << 20, 2}, {Compression::kNone, Compression::kInt8}, o),
                   3.6e-3 + 2 * 3.6e-3 * (0.25 + 1.0 / 64));
}

// backprop's schedule: auto: the fastest schedule that fits. Without a cap
// ZB-H1 (its prediction is below 1F1B's and GPipe's; GPipe may beat 1F1B by
// a little on unequal stages, but holds M micro-batches); under a cap between
// 1F1B's largest stage peak and ZB-H1's (ZB-H1 holds J micro-batches on every
// stage, 1F1B J - j), 1F1B; with every block rebuilding, never ZB-H1.
TEST(Planner, AutoScheduleIsTheFastestThatFits) {
  std::mt19937 rng(3);
  ModelProfile p = SyntheticProfile(6, rng);
  PlanOptions o;
  o.num_stages = 4;
  o.micro_batches = 8;
  o.schedule = std::nullopt;  // auto
  o.modes = BlockModes::kStore;
  o.ranges = {{0, 2}, {2, 4}, {4, 6}, {6, 8}};
  auto free = ChooseSchedule(p, o);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_EQ(free->schedule, PipelineSchedule::kZbH1);
  ASSERT_EQ(free->tried.size(), 3u);
  std::map<PipelineSchedule, double> seconds(free->tried.begin(), free->tried.end());
  EXPECT_LT(seconds[PipelineSchedule::kZbH1], seconds[PipelineSchedule::kOneFOneB]);
  EXPECT_LT(seconds[PipelineSchedule::kZbH1], seconds[PipelineSchedule::kGpipe]);

  // Each stage's peak under each schedule alone, to put the caps between them.
  auto peaks_of = [&](PipelineSchedule s) {
    PlanOptions one = o;
    one.schedule = s;
    auto plan = MakePlan(p, one);
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::vector<int64_t> peaks;
    for (const StagePlan& st : plan->stages) peaks.push_back(st.estimate.peak_bytes);
    return peaks;
  };
  const std::vector<int64_t> one_f_one_b = peaks_of(PipelineSchedule::kOneFOneB);
  const std::vector<int64_t> zb = peaks_of(PipelineSchedule::kZbH1);
  ASSERT_EQ(one_f_one_b.size(), 4u);
  ASSERT_EQ(zb.size(), 4u);
  ASSERT_LT(one_f_one_b[3], zb[3]);  // the last stage: 1 micro-batch against J
  for (int j = 0; j < 4; ++j) o.memory_caps.push_back((one_f_one_b[j] + zb[j] + 1) / 2);
  auto capped = ChooseSchedule(p, o);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->schedule, PipelineSchedule::kOneFOneB);
  seconds = std::map<PipelineSchedule, double>(capped->tried.begin(), capped->tried.end());
  EXPECT_EQ(seconds[PipelineSchedule::kZbH1], -1);  // did not fit

  o.memory_caps.clear();
  o.modes = BlockModes::kRebuild;
  auto rebuild = ChooseSchedule(p, o);
  ASSERT_TRUE(rebuild.ok()) << rebuild.status();
  EXPECT_NE(rebuild->schedule, PipelineSchedule::kZbH1);
  for (const auto& [s, t] : rebuild->tried) EXPECT_NE(s, PipelineSchedule::kZbH1);

  // Nothing fits: the planner's error.
  o.modes = BlockModes::kStore;
  o.memory_caps = {1};
  EXPECT_EQ(ChooseSchedule(p, o).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(Planner, ParseBytes) {
  EXPECT_EQ(*ParseBytes("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseBytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseBytes("1.5G"), 1500000000);
  EXPECT_EQ(*ParseBytes("1000"), 1000);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("2 parsecs").ok());
}

TEST(Profile, SerializeParseRoundTrip) {
  std::mt19937 rng(2);
  ModelProfile p = SyntheticProfile(3, rng);
  p.key = "k";
  p.device = "cpu";
  p.threads = 1;
  p.repeats = 5;
  p.aux_head = "conv:16,16";
  auto q = ParseProfile(SerializeProfile(p));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(SerializeProfile(*q), SerializeProfile(p));
  EXPECT_EQ(q->blocks.size(), p.blocks.size());
  auto bad = ParseProfile("stagewise-profile 2\nblock 0 stem 0 x\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos);
  // A profile of the previous version (timed from a cold process) is not taken.
  std::string old = SerializeProfile(p);
  old.replace(0, old.find('\n'), "stagewise-profile 1");
  EXPECT_FALSE(ParseProfile(old).ok());
}

TEST(Planner, PlanSummaryNamesEveryStageAndPrediction) {
  Plan plan;
  StagePlan a;
  a.begin = 0;
  a.end = 3;
  a.store = {true, false, false};
  a.estimate.forward_s = 1;
  a.estimate.backward_s = 2;
  a.estimate.step_s = 0.5;
  a.estimate.message_s = 0.25;
  a.estimate.aux_head_s = 0.125;
  a.estimate.peak_bytes = 1 << 20;
  StagePlan b;
  b.begin = 3;
  b.end = 5;
  b.store = {true, true};
  b.estimate.forward_s = 4;
  plan.stages = {a, b};
  plan.predictions = {{{.algorithm = AlgorithmKind::kPetra}, 1.5, 2, ""},
                      {{.algorithm = AlgorithmKind::kNwise, .nwise_n = 2}, 0.75, 4, ""}};

  const std::vector<std::pair<std::string, double>> summary = PlanSummary(plan);
  const std::vector<std::pair<std::string, double>> expected = {
      {"plan.stage0.block_begin", 0},       {"plan.stage0.block_end", 3},
      {"plan.stage0.peak_bytes", 1 << 20},  {"plan.stage0.seconds_per_batch", 3.875},
      {"plan.stage0.rebuild_blocks", 2},    {"plan.stage1.block_begin", 3},
      {"plan.stage1.block_end", 5},         {"plan.stage1.peak_bytes", 0},
      {"plan.stage1.seconds_per_batch", 4}, {"plan.stage1.rebuild_blocks", 0},
      {"plan.predicted.petra", 1.5},        {"plan.predicted.nwise_n2", 0.75},
  };
  EXPECT_EQ(summary, expected);
  EXPECT_TRUE(PlanSummary(Plan{}).empty());
}

// The planner's values on the wire (plan_proto.h): a profile survives its
// proto exactly; what the planner would trip on is refused naming the field;
// schedules and modes map one to one, "none" to UNSPECIFIED.
TEST(PlanProto, ProfilesSchedulesAndModesRoundTrip) {
  std::mt19937 rng(5);
  ModelProfile p = SyntheticProfile(3, rng);
  p.key = "k";
  p.device = "cuda:0";
  p.aux_head = "conv";
  const v1::ModelProfile proto = ToProto(p);
  auto back = ProfileFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SerializeProfile(*back), SerializeProfile(p));

  v1::ModelProfile bad = proto;
  bad.mutable_blocks(2)->set_backward_s(-1);
  EXPECT_NE(ProfileFromProto(bad).status().message().find("blocks[2].backward_s"),
            std::string::npos);
  bad = proto;
  bad.mutable_blocks(1)->set_index(3);
  EXPECT_NE(ProfileFromProto(bad).status().message().find("blocks[1].index"), std::string::npos);
  bad = proto;
  bad.mutable_blocks(0)->set_graph_bytes(-5);
  EXPECT_FALSE(ProfileFromProto(bad).ok());
  bad = proto;
  bad.set_batch_size(0);
  EXPECT_NE(ProfileFromProto(bad).status().message().find("batch_size"), std::string::npos);
  EXPECT_FALSE(ProfileFromProto(v1::ModelProfile{}).ok());

  EXPECT_EQ(ToProto(std::optional<PipelineSchedule>{}), v1::PIPELINE_SCHEDULE_UNSPECIFIED);
  for (PipelineSchedule s : {PipelineSchedule::kGpipe, PipelineSchedule::kOneFOneB,
                             PipelineSchedule::kZbH1, PipelineSchedule::kInterleaved}) {
    auto r = ScheduleFromProto(ToProto(s), "f");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, s);
  }
  EXPECT_EQ(ToProto(PipelineSchedule::kOneFOneB), v1::PIPELINE_SCHEDULE_1F1B);
  EXPECT_EQ(*ScheduleFromProto(v1::PIPELINE_SCHEDULE_UNSPECIFIED, "f"), std::nullopt);
  EXPECT_NE(ScheduleFromProto(static_cast<v1::PipelineSchedule>(42), "StageAssignment.schedule")
                .status()
                .message()
                .find("StageAssignment.schedule"),
            std::string::npos);
  google::protobuf::RepeatedField<int> modes;
  modes.Add(ToProto(BlockMode::kRebuild));
  modes.Add(ToProto(BlockMode::kStore));
  auto m = ModesFromProto(modes, "block_modes");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, (std::vector<BlockMode>{BlockMode::kRebuild, BlockMode::kStore}));
  modes.Add(0);
  EXPECT_NE(ModesFromProto(modes, "block_modes").status().message().find("block_modes[2]"),
            std::string::npos);
}

// Predictions are found by what they are of; labels are derived.
TEST(PlanProto, PredictionsAreKeyedByKind) {
  EXPECT_EQ(LabelOf({}), "backprop");
  EXPECT_EQ(LabelOf({.schedule = PipelineSchedule::kZbH1, .micro_batches = 8}),
            "backprop zb-h1 M=8");
  EXPECT_EQ(LabelOf({.schedule = PipelineSchedule::kInterleaved, .micro_batches = 4, .chunks = 2}),
            "backprop interleaved v=2 M=4");
  EXPECT_EQ(LabelOf({.algorithm = AlgorithmKind::kNwise, .nwise_n = 2}), "nwise n=2");
  std::mt19937 rng(9);
  PlanOptions o;
  o.num_stages = 2;
  o.micro_batches = 4;
  auto plan = MakePlan(SyntheticProfile(4, rng), o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Prediction* one = plan->Find({.schedule = PipelineSchedule::kOneFOneB, .micro_batches = 4});
  ASSERT_NE(one, nullptr);
  EXPECT_GT(one->seconds_per_batch, 0);
  EXPECT_EQ(plan->Find({.schedule = PipelineSchedule::kOneFOneB, .micro_batches = 5}), nullptr);
  EXPECT_NE(plan->Find({.algorithm = AlgorithmKind::kPetra}), nullptr);
}

}  // namespace
}  // namespace stagewise::planner
