// The planner's memory model for the copies of a stage's parameters that
// `delayed` and the look-ahead hold (StageRole::parameter_copies): weight
// stashing costs one copy per mini-batch in flight plus the current weights
// during a backward, predict_weights w_prev plus the current weights during
// a forward; none on the last stage (no delay), none for `weights: current`
// without the look-ahead; a job's algorithm options set them; and a cap that
// the copies push a stage over is refused, naming the bytes. `delayed` with
// `forward: once` keeps a graph per mini-batch in flight instead of
// recomputing: more memory, less time, and a cap only the recomputing form
// fits is refused naming algorithm.forward.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "services/planner/planner.h"
#include "services/planner/profile.h"
#include "services/spec/job_spec.h"

namespace stagewise::planner {
namespace {

constexpr int64_t kParameterBytes = 1 << 16;

// Four identical non-reversible blocks of 64 KiB of parameters each.
ModelProfile FourBlocks() {
  ModelProfile p;
  p.model = "four";
  p.batch_size = 8;
  p.label_bytes = 64;
  for (int i = 0; i < 4; ++i) {
    BlockProfile b;
    b.index = i;
    b.kind = "linear";
    b.forward_s = b.forward_nograd_s = b.backward_s = 1e-3;
    b.step_s = 1e-4;
    b.input_bytes = b.output_bytes = 4096;
    b.graph_bytes = 8192;
    b.parameter_bytes = b.optimizer_bytes = kParameterBytes;
    p.blocks.push_back(b);
  }
  return p;
}

// The same with graphs (1 MiB a block) far larger than a parameter copy.
ModelProfile FourBlocksWithLargeGraphs() {
  ModelProfile p = FourBlocks();
  for (BlockProfile& b : p.blocks) b.graph_bytes = 1 << 20;
  return p;
}

PlanOptions TwoStages(AlgorithmKind algorithm) {
  PlanOptions o;
  o.num_stages = 2;
  o.algorithm = algorithm;
  o.ranges = {{0, 2}, {2, 4}};
  return o;
}

// Static bytes of each stage of the plan.
std::vector<int64_t> StaticBytes(const PlanOptions& o) {
  auto plan = MakePlan(FourBlocks(), o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<int64_t> out;
  if (!plan.ok()) return out;
  for (const StagePlan& s : plan->stages) out.push_back(s.estimate.static_bytes);
  return out;
}

TEST(PlannerMemory, StashedWeightsCostACopyPerMiniBatchInFlight) {
  PlanOptions current = TwoStages(AlgorithmKind::kDelayed);
  current.stash_weights = false;
  current.forward_once = false;
  PlanOptions stash = TwoStages(AlgorithmKind::kDelayed);
  stash.forward_once = false;
  const std::vector<int64_t> without = StaticBytes(current);
  const std::vector<int64_t> with = StaticBytes(stash);
  ASSERT_EQ(without.size(), 2u);
  ASSERT_EQ(with.size(), 2u);
  // Stage 0 of 2: 2(J-1-j)+1 = 3 mini-batches in flight, so 3 stashes and
  // the current weights during a recomputation, of its two blocks.
  EXPECT_EQ(with[0] - without[0], (3 + 1) * 2 * kParameterBytes);
  EXPECT_EQ(with[1], without[1]);  // the last stage has no delay
  // forward: once runs each graph at its stash in place: no copy back.
  PlanOptions once = TwoStages(AlgorithmKind::kDelayed);
  EXPECT_EQ(StaticBytes(once)[0] - without[0], 3 * 2 * kParameterBytes);
}

TEST(PlannerMemory, OneForwardKeepsAGraphPerMiniBatchInFlightAndSkipsTheRecomputation) {
  PlanOptions recompute = TwoStages(AlgorithmKind::kDelayed);
  recompute.forward_once = false;
  PlanOptions once = TwoStages(AlgorithmKind::kDelayed);
  auto r = MakePlan(FourBlocksWithLargeGraphs(), recompute);
  auto o = MakePlan(FourBlocksWithLargeGraphs(), once);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(o.ok()) << o.status();
  const StageEstimate& er = r->stages[0].estimate;
  const StageEstimate& eo = o->stages[0].estimate;
  // Three graphs of 2 MiB against three stored inputs and one copy less.
  EXPECT_GT(eo.peak_bytes, er.peak_bytes);
  // One forward instead of a graph-free one and a recomputation.
  EXPECT_DOUBLE_EQ(er.forward_s + er.backward_s, 2 * 3e-3);
  EXPECT_DOUBLE_EQ(eo.forward_s + eo.backward_s, 2 * 2e-3);
  // The last stage runs alike either way.
  EXPECT_EQ(r->stages[1].estimate.peak_bytes, o->stages[1].estimate.peak_bytes);
  // max_in_flight caps the graphs kept.
  PlanOptions capped = once;
  capped.max_in_flight = 1;
  auto c = MakePlan(FourBlocksWithLargeGraphs(), capped);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LT(c->stages[0].estimate.peak_bytes, eo.peak_bytes);
}

TEST(PlannerMemory, ACapOnlyTheRecomputingFormFitsIsRefusedNamingTheKey) {
  PlanOptions recompute = TwoStages(AlgorithmKind::kDelayed);
  recompute.forward_once = false;
  auto fits = MakePlan(FourBlocksWithLargeGraphs(), recompute);
  ASSERT_TRUE(fits.ok()) << fits.status();
  PlanOptions once = TwoStages(AlgorithmKind::kDelayed);
  once.memory_caps = {fits->stages[0].estimate.peak_bytes};
  recompute.memory_caps = once.memory_caps;
  EXPECT_TRUE(MakePlan(FourBlocksWithLargeGraphs(), recompute).ok());
  auto refused = MakePlan(FourBlocksWithLargeGraphs(), once);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("algorithm.forward"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("recompute needs"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("and fits"), std::string::npos) << refused.status();
}

TEST(PlannerMemory, TheLookAheadCostsTwoCopiesWithoutAStash) {
  for (AlgorithmKind algorithm : {AlgorithmKind::kPetra, AlgorithmKind::kDelayed}) {
    PlanOptions plain = TwoStages(algorithm);
    plain.stash_weights = false;
    PlanOptions predict = plain;
    predict.predict_weights = true;
    const std::vector<int64_t> without = StaticBytes(plain);
    const std::vector<int64_t> with = StaticBytes(predict);
    ASSERT_EQ(with.size(), 2u);
    EXPECT_EQ(with[0] - without[0], 2 * 2 * kParameterBytes);  // w_prev and the current w
    EXPECT_EQ(with[1], without[1]);
  }
  // With a stash the forward's copy of the current weights is the stash's.
  PlanOptions stash = TwoStages(AlgorithmKind::kDelayed);
  PlanOptions both = stash;
  both.predict_weights = true;
  EXPECT_EQ(StaticBytes(both)[0] - StaticBytes(stash)[0], 2 * kParameterBytes);
  // Backprop keeps no copies whatever the options say.
  PlanOptions backprop = TwoStages(AlgorithmKind::kBackprop);
  PlanOptions flagged = backprop;
  flagged.predict_weights = true;
  EXPECT_EQ(StaticBytes(flagged), StaticBytes(backprop));
}

TEST(PlannerMemory, TheJobsAlgorithmOptionsSetTheCopies) {
  const std::string base =
      "name: m\nmodel: {name: mlp}\ndata: {dataset: synthetic}\nstages: 2\nsteps: 1\n";
  auto stash = ParseJobSpec(base + "algorithm: {name: delayed}\n");
  ASSERT_TRUE(stash.ok()) << stash.status();
  PlanOptions o = PlanOptionsForJob(*stash, {{0, 1}, {1, 2}});
  EXPECT_TRUE(o.stash_weights);
  EXPECT_FALSE(o.predict_weights);
  EXPECT_TRUE(o.forward_once);  // forward: auto with stash
  auto recompute = ParseJobSpec(base + "algorithm: {name: delayed, forward: recompute}\n");
  ASSERT_TRUE(recompute.ok()) << recompute.status();
  EXPECT_FALSE(PlanOptionsForJob(*recompute, {{0, 1}, {1, 2}}).forward_once);
  auto current = ParseJobSpec(base + "algorithm: {name: delayed, weights: current}\n");
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_FALSE(PlanOptionsForJob(*current, {{0, 1}, {1, 2}}).stash_weights);
  EXPECT_FALSE(PlanOptionsForJob(*current, {{0, 1}, {1, 2}}).forward_once);
  auto petra = ParseJobSpec(base + "algorithm: {name: petra, predict_weights: true}\n");
  ASSERT_TRUE(petra.ok()) << petra.status();
  EXPECT_TRUE(PlanOptionsForJob(*petra, {{0, 1}, {1, 2}}).predict_weights);
}

TEST(PlannerMemory, ACapTheStashDoesNotFitIsRefused) {
  PlanOptions current = TwoStages(AlgorithmKind::kDelayed);
  current.stash_weights = false;
  auto fits = MakePlan(FourBlocks(), current);
  ASSERT_TRUE(fits.ok()) << fits.status();
  // A cap just above what weights: current needs on stage 0.
  PlanOptions stash = TwoStages(AlgorithmKind::kDelayed);
  stash.memory_caps = {fits->stages[0].estimate.peak_bytes + 1024};
  current.memory_caps = stash.memory_caps;
  EXPECT_TRUE(MakePlan(FourBlocks(), current).ok());
  auto refused = MakePlan(FourBlocks(), stash);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("memory cap"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace stagewise::planner
