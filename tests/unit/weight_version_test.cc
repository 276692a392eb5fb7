// WeightVersion (worker/algorithms/weight_version.h): a graph made while a
// version is in use (InUse) survives in-place steps of the parameters made in
// between, and its backward (the version in use again) gives the gradients at
// the version's weights, into the parameters' own .grad; otherwise the
// parameters hold their current values. Without it the same backward fails
// autograd's version check (what the helper is for).
#include "worker/algorithms/weight_version.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace stagewise::worker {
namespace {

struct Net : torch::nn::Module {
  Net() {
    a = register_module("a", torch::nn::Linear(4, 5));
    b = register_module("b", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::tanh(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

// The gradients of sum(net(x) * g) at the net's current weights, and x's.
std::vector<torch::Tensor> Grads(Net& net, const torch::Tensor& x, const torch::Tensor& g) {
  net.zero_grad();
  torch::Tensor xi = x.detach().clone().requires_grad_(true);
  net.forward(xi).backward(g);
  std::vector<torch::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.grad().clone());
  out.push_back(xi.grad().clone());
  net.zero_grad();
  return out;
}

TEST(WeightVersion, AKeptGraphGivesTheGradientsAtItsVersionAfterInPlaceSteps) {
  torch::manual_seed(7);
  Net net;
  const torch::Tensor x = torch::randn({6, 4});
  const torch::Tensor g = torch::randn({6, 3});
  const std::vector<torch::Tensor> want = Grads(net, x, g);  // at the weights now
  std::vector<torch::Tensor> params = net.parameters();
  std::vector<torch::Tensor> before;
  for (const auto& p : params) before.push_back(p.detach().clone());

  WeightVersion v = WeightVersion::Take(params);
  torch::Tensor xi = x.clone().requires_grad_(true);
  torch::Tensor out;
  {
    WeightVersion::InUse at(v, params);
    out = net.forward(xi);
  }
  // Two optimizer-like steps in place while the graph waits.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params) p.add_(0.5);
    for (auto& p : params) p.mul_(1.5);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i].allclose((before[i] + 0.5) * 1.5))
        << "the step lands on the live weights";
  }
  {
    WeightVersion::InUse at(v, params);
    EXPECT_TRUE(params[0].equal(before[0])) << "in use: the version's values";
    out.backward(g);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined());
    EXPECT_TRUE(params[i].grad().allclose(want[i], 1e-5, 1e-6)) << "parameter " << i;
    EXPECT_TRUE(params[i].allclose((before[i] + 0.5) * 1.5)) << "the live weights come back";
  }
  EXPECT_TRUE(xi.grad().allclose(want.back(), 1e-5, 1e-6));
  EXPECT_EQ(v.bytes(), static_cast<int64_t>((4 * 5 + 5 + 5 * 3 + 3) * sizeof(float)));
  // A step afterwards still moves the live weights, not the version.
  {
    torch::NoGradGuard no_grad;
    params[0].add_(1.0);
  }
  EXPECT_TRUE(v.values()[0].equal(before[0]));
}

TEST(WeightVersion, WithoutItAKeptGraphFailsAfterAnInPlaceStep) {
  torch::manual_seed(7);
  Net net;
  torch::Tensor out = net.forward(torch::randn({2, 4}));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net.parameters()) p.add_(0.5);
  }
  EXPECT_THROW(out.backward(torch::ones({2, 3})), c10::Error);
}

}  // namespace
}  // namespace stagewise::worker
