// The exact pipeline schedules' per-stage orders (services/planner/
// pipeline_schedule.h): every order is complete and runs without deadlock,
// 1F1B keeps its memory bound, and the simulated time per mini-batch of each
// schedule follows its bubble formula (Qi et al., Zero Bubble PP, Sec. 3).
#include "services/planner/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <string>

namespace stagewise::pipeline {
namespace {

std::string Joined(const std::vector<Op>& ops) {
  std::string s;
  for (const Op& op : ops) s += (s.empty() ? "" : " ") + OpName(op);
  return s;
}

Simulation Played(PipelineSchedule schedule, const ScheduleOptions& o) {
  auto orders = StageOrders(schedule, o);
  EXPECT_TRUE(orders.ok()) << orders.status();
  if (!orders.ok()) return {};
  auto sim = Simulate(*orders, o);
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? *sim : Simulation{};
}

TEST(StageOrders, OneFOneBWarmsUpWithJMinusOneMinusJForwards) {
  auto orders = StageOrders(PipelineSchedule::kOneFOneB, {.stages = 3, .micro_batches = 4});
  ASSERT_TRUE(orders.ok()) << orders.status();
  EXPECT_EQ(Joined((*orders)[0]), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(Joined((*orders)[1]), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(Joined((*orders)[2]), "F0 B0 F1 B1 F2 B2 F3 B3");
}

TEST(StageOrders, ZbH1DefersStageJsWeightGradientsByJMicroBatches) {
  auto orders = StageOrders(PipelineSchedule::kZbH1, {.stages = 3, .micro_batches = 4});
  ASSERT_TRUE(orders.ok()) << orders.status();
  EXPECT_EQ(Joined((*orders)[0]), "F0 F1 F2 B0 F3 B1 B2 B3");  // fused: no input gradient to send
  EXPECT_EQ(Joined((*orders)[1]), "F0 F1 Bi0 F2 Bi1 W0 F3 Bi2 W1 Bi3 W2 W3");
  EXPECT_EQ(Joined((*orders)[2]), "F0 Bi0 F1 Bi1 F2 Bi2 W0 F3 Bi3 W1 W2 W3");
}

// Megatron's order: groups of J micro-batches per chunk, 2(J-1-j) + (v-1)J
// forwards of warm-up.
TEST(StageOrders, InterleavedGoesRoundTheChunksInGroupsOfJ) {
  auto orders =
      StageOrders(PipelineSchedule::kInterleaved, {.stages = 2, .micro_batches = 2, .chunks = 2});
  ASSERT_TRUE(orders.ok()) << orders.status();
  EXPECT_EQ(Joined((*orders)[0]), "F0 F1 F0c1 F1c1 B0c1 B1c1 B0 B1");
  EXPECT_EQ(Joined((*orders)[1]), "F0 F1 F0c1 B0c1 F1c1 B1c1 B0 B1");
  EXPECT_EQ(
      StageOrders(PipelineSchedule::kInterleaved, {.stages = 2, .micro_batches = 3, .chunks = 2})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StageOrders(PipelineSchedule::kOneFOneB, {.stages = 2, .micro_batches = 2, .chunks = 2})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StageOrders, RefusesBadOptionsNamingTheField) {
  EXPECT_NE(StageOrders(PipelineSchedule::kGpipe, {.stages = 0}).status().message().find("stages"),
            std::string::npos);
  EXPECT_NE(StageOrders(PipelineSchedule::kGpipe, {.stages = 2, .micro_batches = 0})
                .status()
                .message()
                .find("micro_batches"),
            std::string::npos);
  ScheduleOptions o{.stages = 2, .micro_batches = 2};
  o.costs.resize(3);
  EXPECT_NE(StageOrders(PipelineSchedule::kZbH1, o).status().message().find("costs"),
            std::string::npos);
}

TEST(Simulate, FindsDeadlocksAndMissingOperations) {
  ScheduleOptions o{.stages = 2, .micro_batches = 1};
  // Stage 0 waits for a gradient before sending its forward.
  std::vector<std::vector<Op>> cycle = {{{OpKind::kBackward, 0}, {OpKind::kForward, 0}},
                                        {{OpKind::kForward, 0}, {OpKind::kBackward, 0}}};
  auto sim = Simulate(cycle, o);
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(sim.status().message().find("deadlock"), std::string::npos) << sim.status();
  std::vector<std::vector<Op>> missing = {{{OpKind::kForward, 0}}, {{OpKind::kForward, 0}}};
  EXPECT_EQ(Simulate(missing, o).status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<std::vector<Op>> twice = {{{OpKind::kForward, 0}, {OpKind::kForward, 0}}, {}};
  EXPECT_NE(Simulate(twice, o).status().message().find("twice"), std::string::npos);
}

// Unit costs F = B = W = 1: a mini-batch takes 3M + 3(J-1) with GPipe and
// 1F1B and, when M >= J, 3M + (J-1) with ZB-H1 (the bubble (J-1)(F+B-W) of
// the paper); peak memory: M, J-j and J micro-batches.
TEST(Simulate, TimesFollowTheBubbleFormulas) {
  for (int J : {1, 2, 3, 4, 8, 16}) {
    for (int M : {1, 2, 4, 8, 16, 32}) {
      SCOPED_TRACE(testing::Message() << "J=" << J << " M=" << M);
      const ScheduleOptions o{.stages = J, .micro_batches = M};
      const Simulation gpipe = Played(PipelineSchedule::kGpipe, o);
      const Simulation one = Played(PipelineSchedule::kOneFOneB, o);
      const Simulation zb = Played(PipelineSchedule::kZbH1, o);
      EXPECT_DOUBLE_EQ(gpipe.seconds, 3 * M + 3 * (J - 1));
      EXPECT_DOUBLE_EQ(one.seconds, 3 * M + 3 * (J - 1));
      if (M >= J) {
        EXPECT_DOUBLE_EQ(zb.seconds, 3 * M + (J - 1));
      } else {  // too few micro-batches to fill the bubbles with W
        EXPECT_LT(zb.seconds, one.seconds);
      }
      EXPECT_NEAR(one.bubble, 3.0 * (J - 1) / (3 * M + 3 * (J - 1)), 1e-12);
      for (int j = 0; j < J; ++j) {
        EXPECT_EQ(gpipe.peak_in_flight[j], MaxInFlight(PipelineSchedule::kGpipe, o, j)) << j;
        EXPECT_EQ(one.peak_in_flight[j], MaxInFlight(PipelineSchedule::kOneFOneB, o, j)) << j;
        EXPECT_EQ(zb.peak_in_flight[j], MaxInFlight(PipelineSchedule::kZbH1, o, j)) << j;
        EXPECT_LE(zb.peak_in_flight[j], one.peak_in_flight[0]) << j;  // 1F1B's peak
      }
    }
  }
}

// Interleaved with v chunks: (J-1)/v of 1F1B's bubble, 3M + 3(J-1)/v units.
TEST(Simulate, InterleavedCutsTheBubbleByTheChunkCount) {
  for (int J : {2, 4, 8}) {
    for (int v : {1, 2, 4}) {
      for (int groups : {1, 2, 4}) {
        const int M = groups * J;
        SCOPED_TRACE(testing::Message() << "J=" << J << " v=" << v << " M=" << M);
        const ScheduleOptions o{.stages = J, .micro_batches = M, .chunks = v};
        const Simulation sim = Played(PipelineSchedule::kInterleaved, o);
        EXPECT_NEAR(sim.seconds, 3 * M + 3.0 * (J - 1) / v, 1e-9);
        for (int j = 0; j < J; ++j) {
          EXPECT_EQ(sim.peak_in_flight[j], MaxInFlight(PipelineSchedule::kInterleaved, o, j)) << j;
        }
      }
    }
  }
}

// Costs that are not equal, a link delay and a lookahead: every order still
// completes, and ZB-H1 is never slower than 1F1B.
TEST(Simulate, ZbH1IsNeverSlowerThanOneFOneB) {
  for (int J : {2, 3, 5}) {
    for (int M : {1, 3, 8}) {
      for (int lookahead : {0, 1}) {
        ScheduleOptions o{.stages = J, .micro_batches = M, .lookahead = lookahead};
        for (int j = 0; j < J; ++j) o.costs.push_back({1.0 + 0.3 * j, 0.7 + 0.1 * j, 1.4});
        o.link_seconds = 0.25;
        const Simulation one = Played(PipelineSchedule::kOneFOneB, o);
        const Simulation zb = Played(PipelineSchedule::kZbH1, o);
        EXPECT_LE(zb.seconds, one.seconds + 1e-9) << "J=" << J << " M=" << M;
      }
    }
  }
}

}  // namespace
}  // namespace stagewise::pipeline
