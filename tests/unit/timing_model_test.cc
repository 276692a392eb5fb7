// The interlocking-backpropagation timing model T(A, M, N) (Interlocking
// Backpropagation, Sec. 3.1 and App. C; docs/references.md) against the
// paper's formula cases and its stated consequences.
#include "services/planner/timing_model.h"

#include <gtest/gtest.h>

#include <cmath>

namespace stagewise::timing {
namespace {

double Slots(int64_t A, int64_t M, int64_t N) {
  auto s = InterlockSlots(A, M, N);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : -1;
}

// The cost parameters the paper fitted to its Transformer runs (Fig. 10).
const MicroBatchCost kPaper{0.025, 1.279};

TEST(InterlockSlots, FollowsEachCaseOfTheFormula) {
  // M = 1: 2N M.
  EXPECT_EQ(Slots(4, 1, 1), 2);
  EXPECT_EQ(Slots(4, 1, 3), 6);
  // M = 2: (N + 1) M.
  EXPECT_EQ(Slots(4, 2, 2), 6);
  EXPECT_EQ(Slots(6, 2, 6), 14);
  // M > 2 and A >= 2N - 1: (N + 1) M.
  EXPECT_EQ(Slots(5, 4, 3), 16);
  EXPECT_EQ(Slots(8, 8, 2), 24);
  // M > 2 and A < 2N - 1: (2 + A - N) M + 2(2N - A - 1).
  EXPECT_EQ(Slots(4, 4, 3), 3 * 4 + 2 * 1);
  EXPECT_EQ(Slots(6, 8, 5), 3 * 8 + 2 * 3);
}

TEST(InterlockSlots, EndToEndDegeneratesToGPipe) {
  // N = A gives 2(M + A - 1) for every M.
  for (int64_t A = 1; A <= 12; ++A) {
    for (int64_t M : {1, 2, 3, 4, 8, 16, 32}) {
      EXPECT_EQ(Slots(A, M, A), 2 * (M + A - 1)) << "A=" << A << " M=" << M;
    }
  }
}

TEST(InterlockSlots, IndependentOfDepthWhenNIsSmall) {
  // Sec. 3.1: for N < 1 + A/2 the time per batch does not depend on A.
  for (int64_t N = 1; N <= 4; ++N) {
    for (int64_t M : {1, 2, 4, 16}) {
      const double first = Slots(2 * N - 1, M, N);
      for (int64_t A = 2 * N - 1; A <= 24; ++A) EXPECT_EQ(Slots(A, M, N), first);
    }
  }
}

TEST(InterlockSlots, RejectsArgumentsOutsideTheModel) {
  EXPECT_EQ(InterlockSlots(0, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InterlockSlots(4, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto n = InterlockSlots(4, 1, 5);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("N:"), std::string::npos);
}

TEST(InterlockTime, ScalesSlotsByTheMicroBatchCost) {
  auto t = InterlockTimePerBatch(4, 4, 4, kPaper);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(*t, 2 * (4 + 4 - 1) * (0.025 + 1.279 / 4));
}

TEST(OptimalMicroBatches, ReproducesTable7ForEndToEndOneAndTwoWise) {
  // Table 7 columns A = 2, 3, 4, 5, 6-11, 12-30. (Its 3- to 5-WISE rows do
  // not follow from the formula as printed, so they are not checked.)
  struct Row {
    int64_t a_lo, a_hi, end_to_end, one_wise, two_wise;
  };
  for (const Row& r : std::vector<Row>{{2, 2, 8, 1, 8},
                                       {3, 3, 8, 1, 2},
                                       {4, 4, 16, 1, 2},
                                       {5, 5, 16, 1, 2},
                                       {6, 11, 16, 1, 2},
                                       {12, 30, 32, 1, 2}}) {
    for (int64_t A = r.a_lo; A <= r.a_hi; ++A) {
      EXPECT_EQ(*OptimalMicroBatches(A, A, kPaper), r.end_to_end) << "A=" << A;
      EXPECT_EQ(*OptimalMicroBatches(A, 1, kPaper), r.one_wise) << "A=" << A;
      EXPECT_EQ(*OptimalMicroBatches(A, 2, kPaper), r.two_wise) << "A=" << A;
    }
  }
}

TEST(OptimalMicroBatches, TwoWiseIsFiftyPercentFasterFromFifteenAccelerators) {
  // Sec. 3.1: with the optimal M for each, the model predicts a 50% speed-up
  // of 2-WISE over end-to-end at 15 or more accelerators.
  for (int64_t A = 3; A <= 30; ++A) {
    const double e2e = *InterlockTimePerBatch(A, *OptimalMicroBatches(A, A, kPaper), A, kPaper);
    const double two = *InterlockTimePerBatch(A, *OptimalMicroBatches(A, 2, kPaper), 2, kPaper);
    EXPECT_EQ(e2e / two >= 1.495, A >= 15)
        << "A=" << A << " speed-up " << e2e / two;  // 50%, to the percent
  }
}

TEST(FitMicroBatchCost, RecoversTheCostFromExactTimes) {
  std::vector<InterlockSample> samples;
  for (int64_t M : {1, 2, 4, 8}) {
    for (int64_t N : {1, 2, 4}) {
      samples.push_back({4, M, N, *InterlockTimePerBatch(4, M, N, kPaper)});
    }
  }
  auto fit = FitMicroBatchCost(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->c0, 0.025, 1e-9);
  EXPECT_NEAR(fit->c1, 1.279, 1e-9);
}

TEST(FitMicroBatchCost, NeedsTwoMicroBatchCounts) {
  // With M = 1 everywhere, c0 and c1 only appear as c0 + c1.
  std::vector<InterlockSample> samples = {{4, 1, 1, 1.0}, {4, 1, 2, 2.0}, {4, 1, 4, 4.0}};
  EXPECT_EQ(FitMicroBatchCost(samples).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FitMicroBatchCost({}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AuxNetSpeedup, IsEquation27) {
  const AuxNetTimes t{.data = 0.1,
                      .forward = 1.0,
                      .backward = 2.0,
                      .penalty = 0.05,
                      .aux_forward = 0.1,
                      .aux_backward = 0.15};
  // K = 3: 3.1 / (0.1 + 1 + 0.05 + 0.25) = 3.1 / 1.4.
  EXPECT_DOUBLE_EQ(*AuxNetSpeedup(3, t), 3.1 / 1.4);
  // The layer-parallel run with K = 1 only adds overhead: below 1.
  EXPECT_LT(*AuxNetSpeedup(1, t), 1.0);
  // Increasing in K, below the bound, and tending to it.
  double previous = 0;
  for (int64_t K = 1; K <= 1024; K *= 2) {
    const double rho = *AuxNetSpeedup(K, t);
    EXPECT_GT(rho, previous);
    EXPECT_LT(rho, *AuxNetSpeedupBound(t));
    previous = rho;
  }
  EXPECT_DOUBLE_EQ(*AuxNetSpeedupBound(t), 3.1 / 0.4);
  EXPECT_NEAR(*AuxNetSpeedup(1 << 20, t), *AuxNetSpeedupBound(t), 1e-3);
  // Without overheads the speed-up is K and unbounded.
  const AuxNetTimes ideal{.forward = 1.0, .backward = 2.0};
  EXPECT_DOUBLE_EQ(*AuxNetSpeedup(4, ideal), 4.0);
  EXPECT_TRUE(std::isinf(*AuxNetSpeedupBound(ideal)));
}

TEST(AuxNetSpeedup, RejectsBadArguments) {
  const AuxNetTimes t{.forward = 1.0};
  EXPECT_EQ(AuxNetSpeedup(0, t).status().code(), absl::StatusCode::kInvalidArgument);
  AuxNetTimes negative = t;
  negative.penalty = -1;
  auto s = AuxNetSpeedup(2, negative);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("t_psi"), std::string::npos);
  EXPECT_EQ(AuxNetSpeedupBound(AuxNetTimes{}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagewise::timing
