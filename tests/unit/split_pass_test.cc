// models::SplitPass: the input gradient (B) and then the weight gradients (W)
// of a stage accumulate exactly what one fused backward does, for the model
// kinds a zero-bubble schedule runs (docs/algorithms.md, backprop); and the
// emulated blocks wait their input share in B and their weight share in W.
#include "services/models/split_pass.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <string>

#include "services/models/loss.h"
#include "services/models/model.h"

namespace stagewise::models {
namespace {

ModelSpec Spec(ModelKind kind, std::vector<int64_t> input, int classes) {
  ModelSpec s;
  s.name = kind;
  s.input_shape = std::move(input);
  s.num_classes = classes;
  s.batch_size = 4;
  if (kind == ModelKind::kRevNet) {
    s.depth = 18;
    s.width = 4;
    s.blocks = {1, 1, 1, 1};
  }
  if (kind == ModelKind::kMlp) s.hidden = {16, 8};
  if (kind == ModelKind::kEmulated) {
    s.depth = 3;
    s.forward_ms = 0;
    s.backward_ms = 0;
    s.reversible = false;
  }
  if (kind == ModelKind::kGpt) {
    s.depth = 2;
    s.width = 16;
    s.heads = 2;
  }
  return s;
}

std::map<std::string, torch::Tensor> Grads(Model& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) {
    if (p.value().grad().defined()) out[p.key()] = p.value().grad().clone();
  }
  return out;
}

struct Case {
  const char* name;
  ModelSpec spec;
  torch::Tensor input;   // the whole model's input
  torch::Tensor labels;  // [batch] or [batch, T]
};

std::vector<Case> Cases() {
  torch::manual_seed(3);
  std::vector<Case> cases;
  cases.push_back(
      {"mlp", Spec(ModelKind::kMlp, {12}, 5), torch::randn({4, 12}), torch::randint(5, {4})});
  cases.push_back({"revnet", Spec(ModelKind::kRevNet, {3, 8, 8}, 4), torch::randn({4, 3, 8, 8}),
                   torch::randint(4, {4})});
  cases.push_back({"emulated", Spec(ModelKind::kEmulated, {4, 3, 3}, 5), torch::randn({4, 4, 3, 3}),
                   torch::randint(5, {4})});
  cases.push_back({"gpt", Spec(ModelKind::kGpt, {10}, 256), torch::randint(256, {4, 10}),
                   torch::randint(256, {4, 10})});
  return cases;
}

// A middle stage (blocks [1, n-1): the input needs its gradient, the output
// gets one from outside) and a last stage (blocks [1, n): the root is the loss).
TEST(SplitPass, InputThenWeightGradientsEqualOneFusedBackward) {
  for (Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto whole = BuildModel(c.spec, 7);
    ASSERT_TRUE(whole.ok()) << whole.status();
    const int n = (*whole)->size();
    ASSERT_GE(n, 3);
    torch::Tensor h;
    {
      torch::NoGradGuard no_grad;
      h = (*whole)->blocks()[0]->forward(c.input);
    }
    for (bool last : {false, true}) {
      SCOPED_TRACE(last ? "last stage" : "middle stage");
      auto stage = BuildModel(c.spec, 7, 1, last ? n : n - 1);
      ASSERT_TRUE(stage.ok()) << stage.status();
      Model& m = **stage;
      torch::manual_seed(11);
      torch::Tensor g_out;

      // Fused.
      torch::Tensor x1 = h.clone().requires_grad_(true);
      torch::Tensor out1 = m.forward(x1);
      if (!last) g_out = torch::randn_like(out1);
      if (last) {
        CrossEntropy(out1, c.labels).backward();
      } else {
        out1.backward(g_out);
      }
      const auto fused = Grads(m);
      const torch::Tensor fused_input = x1.grad().clone();
      m.zero_grad(/*set_to_none=*/true);

      // Split.
      torch::Tensor x2 = h.clone().requires_grad_(true);
      SplitPass pass = SplitPass::Forward(m.blocks(), x2);
      torch::Tensor root = last ? CrossEntropy(pass.output(), c.labels) : pass.output();
      torch::Tensor got_input = pass.BackwardInput(root, last ? torch::Tensor() : g_out);
      EXPECT_TRUE(Grads(m).empty()) << "B must not touch the parameters' gradients";
      pass.BackwardWeight();
      EXPECT_TRUE(pass.empty());
      const auto split = Grads(m);
      m.zero_grad(/*set_to_none=*/true);

      ASSERT_TRUE(got_input.defined());
      EXPECT_TRUE(torch::allclose(got_input, fused_input, 1e-6, 1e-7));
      ASSERT_EQ(split.size(), fused.size());
      for (const auto& [name, want] : fused) {
        ASSERT_TRUE(split.count(name)) << name;
        EXPECT_TRUE(torch::allclose(split.at(name), want, 1e-6, 1e-7)) << name;
      }
    }
  }
}

// The first stage: no input gradient; B leaves nothing to send.
TEST(SplitPass, AFirstStageHasNoInputGradient) {
  ModelSpec spec = Spec(ModelKind::kMlp, {12}, 5);
  auto m = BuildModel(spec, 7);
  ASSERT_TRUE(m.ok()) << m.status();
  SplitPass pass = SplitPass::Forward((*m)->blocks(), torch::randn({4, 12}));
  torch::Tensor loss = CrossEntropy(pass.output(), torch::randint(5, {4}));
  EXPECT_FALSE(pass.BackwardInput(loss, torch::Tensor()).defined());
  pass.BackwardWeight();
  for (const auto& p : (*m)->parameters()) EXPECT_TRUE(p.grad().defined());
}

// Lower bounds only (a wait may end late, never early): 3 blocks, 4 samples
// of a batch of 4 with backward_ms 20 and weight share 0.25: B waits 15 ms
// per block, W 5 ms per block.
TEST(SplitPass, EmulatedBlocksWaitTheirShareInEachPart) {
  ModelSpec spec = Spec(ModelKind::kEmulated, {4, 3, 3}, 5);
  spec.backward_ms = 20;
  spec.backward_weight_share = 0.25;
  auto m = BuildModel(spec, 7, 0, 3);
  ASSERT_TRUE(m.ok()) << m.status();
  torch::Tensor x = torch::randn({4, 4, 3, 3}, torch::requires_grad());
  SplitPass pass = SplitPass::Forward((*m)->blocks(), x);
  const auto t0 = std::chrono::steady_clock::now();
  pass.BackwardInput(pass.output(), torch::ones_like(pass.output()));
  const auto t1 = std::chrono::steady_clock::now();
  pass.BackwardWeight();
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_GE(std::chrono::duration<double>(t1 - t0).count(), 3 * 15e-3);
  EXPECT_GE(std::chrono::duration<double>(t2 - t1).count(), 3 * 5e-3);
}

}  // namespace
}  // namespace stagewise::models
