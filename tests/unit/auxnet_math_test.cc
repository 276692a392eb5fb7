// The auxnet pieces that are plain math or shapes: the auxiliary-variable
// correction against autograd on the analytic penalty, the constraint
// violation, and AuxNets reproducing the main network's boundary shapes.
#include "worker/algorithms/auxnet_math.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "services/models/aux_net.h"

namespace stagewise {
namespace {

TEST(AuxNetMath, CorrectionIsAGradientStepOnThePenaltyPlusTheLocalLoss) {
  torch::manual_seed(3);
  for (double beta : {0.5, 1.0, 40.0}) {
    const torch::Tensor lambda = torch::randn({4, 3, 5, 5});
    const torch::Tensor x_prev = torch::randn({4, 3, 5, 5});
    const torch::Tensor p = torch::randn({4, 3, 5, 5}) * 0.01;
    const double eta = 0.3;
    // Autograd on beta * psi(lambda, x_prev) + <p, lambda>: its gradient with
    // respect to lambda is beta * d psi / d lambda + p.
    torch::Tensor l = lambda.clone().requires_grad_(true);
    torch::Tensor objective = beta * torch::mse_loss(l, x_prev) + (p * l).sum();
    objective.backward();
    const torch::Tensor want = lambda - eta * l.grad();
    const torch::Tensor got = worker::CorrectLambda(lambda, x_prev, p, beta, eta);
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6)) << "beta " << beta;
  }
}

// The distill correction under penalty: relative takes the same step with the
// relative penalty's gradient: one gradient step on beta * psi_rel + <p, lambda>,
// and it is CorrectLambda itself when handed the plain penalty's gradient.
TEST(AuxNetMath, TheRelativeCorrectionIsAGradientStepOnTheRelativePenalty) {
  torch::manual_seed(4);
  const torch::Tensor lambda = torch::randn({4, 3, 5, 5});
  const torch::Tensor x_prev = lambda + 0.2 * torch::randn({4, 3, 5, 5});
  const torch::Tensor p = torch::randn({4, 3, 5, 5}) * 0.01;
  const double beta = 30.0, eta = 0.2;
  torch::Tensor l = lambda.clone().requires_grad_(true);
  (beta * worker::RelativePenalty(l, x_prev) + (p * l).sum()).backward();
  const torch::Tensor want = lambda - eta * l.grad();
  const torch::Tensor got = worker::CorrectLambdaWithGrad(
      lambda, worker::PenaltyGradOf(true, lambda, x_prev), p, beta, eta);
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(
      worker::CorrectLambdaWithGrad(lambda, worker::PenaltyGrad(lambda, x_prev), p, beta, eta),
      worker::CorrectLambda(lambda, x_prev, p, beta, eta)));
}

// aux_update: direct hands the AuxNet beta * PenaltyGrad + p, which must be
// the gradient of beta * psi(lambda, x_prev) + (the stage's loss) in lambda.
TEST(AuxNetMath, PenaltyGradIsTheGradientOfThePenalty) {
  torch::manual_seed(5);
  const torch::Tensor lambda = torch::randn({3, 2, 4, 4});
  const torch::Tensor x_prev = torch::randn({3, 2, 4, 4});
  torch::Tensor l = lambda.clone().requires_grad_(true);
  worker::Penalty(l, x_prev).backward();
  EXPECT_TRUE(torch::allclose(worker::PenaltyGrad(lambda, x_prev), l.grad(), 1e-6, 1e-7));
}

// penalty: relative is scale-free: shrinking both sides together leaves it
// unchanged (the plain penalty falls with the square of the scale), and
// PenaltyGradOf hands out the gradient of the chosen penalty.
TEST(AuxNetMath, TheRelativePenaltyGainsNothingFromShrinking) {
  torch::manual_seed(9);
  const torch::Tensor a = torch::randn({4, 3, 5, 5});
  const torch::Tensor b = a + 0.1 * torch::randn({4, 3, 5, 5});
  for (double scale : {1e-3, 0.5, 20.0}) {
    EXPECT_NEAR(worker::RelativePenalty(scale * a, scale * b).item<double>(),
                worker::RelativePenalty(a, b).item<double>(), 1e-5)
        << scale;
  }
  EXPECT_NEAR(worker::Penalty(0.5 * a, 0.5 * b).item<double>(),
              0.25 * worker::Penalty(a, b).item<double>(), 1e-6);
  for (bool relative : {false, true}) {
    torch::Tensor l = a.clone().requires_grad_(true);
    (relative ? worker::RelativePenalty(l, b) : worker::Penalty(l, b)).backward();
    EXPECT_TRUE(torch::allclose(worker::PenaltyGradOf(relative, a, b), l.grad(), 1e-5, 1e-8))
        << relative;
  }
  EXPECT_TRUE(torch::allclose(worker::PenaltyGradOf(false, a, b), worker::PenaltyGrad(a, b)));
}

TEST(AuxNetMath, RelativeGapIsTheDistanceOverTheSize) {
  const torch::Tensor b = torch::full({2, 3}, 2.0);  // ||b|| = sqrt(24)
  const torch::Tensor a = b + 0.5;                   // ||a - b|| = sqrt(1.5)
  EXPECT_NEAR(worker::RelativeGap(a, b), std::sqrt(1.5 / 24.0), 1e-6);
  EXPECT_EQ(worker::RelativeGap(b, b), 0.0);
}

TEST(AuxNetMath, TheCorrectionMovesLambdaTowardsTheOutputBelow) {
  const torch::Tensor lambda = torch::ones({2, 8});
  const torch::Tensor x_prev = torch::zeros({2, 8});
  const torch::Tensor zero = torch::zeros({2, 8});
  const torch::Tensor moved = worker::CorrectLambda(lambda, x_prev, zero, 4.0, 1.0);
  EXPECT_LT(worker::ConstraintViolation(moved, x_prev),
            worker::ConstraintViolation(lambda, x_prev));
}

TEST(AuxNetMath, ViolationIsTheNormPerSample) {
  const torch::Tensor a = torch::zeros({4, 2});
  const torch::Tensor b = torch::full({4, 2}, 3.0);
  // || a - b ||_F = sqrt(8 * 9); per sample: / sqrt(4).
  EXPECT_NEAR(worker::ConstraintViolation(a, b), std::sqrt(72.0) / 2.0, 1e-5);
}

TEST(AuxNet, ReproducesTheBoundaryShapes) {
  struct Case {
    std::vector<int64_t> in, out;
  };
  for (AuxNetArch kind : {AuxNetArch::kResnet, AuxNetArch::kConv}) {
    for (const Case& c : std::vector<Case>{{{1, 28, 28}, {16, 28, 28}},
                                           {{16, 28, 28}, {32, 14, 14}},
                                           {{64, 7, 7}, {128, 4, 4}},
                                           {{784}, {100}}}) {
      auto net = models::MakeAuxNet(kind, c.in, c.out, 7);
      ASSERT_TRUE(net.ok()) << net.status();
      std::vector<int64_t> shape = {3};
      shape.insert(shape.end(), c.in.begin(), c.in.end());
      torch::Tensor y = (*net)->forward(torch::randn(shape));
      std::vector<int64_t> want = {3};
      want.insert(want.end(), c.out.begin(), c.out.end());
      EXPECT_EQ(y.sizes().vec(), want) << NameOf(kind);
    }
  }
  EXPECT_EQ(models::MakeAuxNet(AuxNetArch::kConv, {4}, {4}, 1, /*blocks=*/0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Seeded: the same seed builds the same weights.
  auto a = models::MakeAuxNet(AuxNetArch::kResnet, {3, 8, 8}, {4, 8, 8}, 11);
  auto b = models::MakeAuxNet(AuxNetArch::kResnet, {3, 8, 8}, {4, 8, 8}, 11);
  const torch::Tensor x = torch::randn({2, 3, 8, 8});
  EXPECT_TRUE(torch::equal((*a)->forward(x), (*b)->forward(x)));
}

// auxnet_blocks: each block adds two conv3x3-BN pairs and keeps the shapes;
// zero blocks is refused naming the key.
TEST(AuxNet, BlocksAddCapacityAndKeepTheShapes) {
  auto count = [](const models::AuxNet& net) {
    int64_t n = 0;
    for (const auto& p : net->parameters()) n += p.numel();
    return n;
  };
  auto one = models::MakeAuxNet(AuxNetArch::kResnet, {8, 28, 28}, {16, 14, 14}, 3, 1);
  auto three = models::MakeAuxNet(AuxNetArch::kResnet, {8, 28, 28}, {16, 14, 14}, 3, 3);
  ASSERT_TRUE(one.ok() && three.ok());
  const int64_t block = 2 * (16 * 16 * 9 + 2 * 16);  // two conv3x3 + two BatchNorms
  EXPECT_EQ(count(*three) - count(*one), 2 * block);
  EXPECT_EQ((*three)->forward(torch::randn({2, 8, 28, 28})).sizes().vec(),
            (std::vector<int64_t>{2, 16, 14, 14}));
  auto zero = models::MakeAuxNet(AuxNetArch::kResnet, {8, 28, 28}, {16, 14, 14}, 3, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("algorithm.auxnet_blocks"), std::string::npos);
}

}  // namespace
}  // namespace stagewise
