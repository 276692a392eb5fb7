// Optimizers and learning-rate schedules.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/models/optimizer_state_key.h"
#include "services/training/optimizer.h"

namespace stagewise::training {
namespace {

TEST(LearningRateAt, ConstantWithWarmup) {
  ScheduleSpec s;
  s.warmup_epochs = 1;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.5, 0, 10, 100), 0.05);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.5, 4, 10, 100), 0.25);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.5, 9, 10, 100), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.5, 99, 10, 100), 0.5);
  s.warmup_epochs = 0;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 0.5, 0, 10, 100), 0.5);
}

TEST(LearningRateAt, MultiStepDropsAtMilestoneEpochs) {
  ScheduleSpec s;
  s.name = LrScheduleKind::kMultistep;
  s.milestones = {2, 4};
  s.gamma = 0.1;
  EXPECT_DOUBLE_EQ(LearningRateAt(s, 1.0, 19, 10, 100), 1.0);
  EXPECT_NEAR(LearningRateAt(s, 1.0, 20, 10, 100), 0.1, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, 1.0, 39, 10, 100), 0.1, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, 1.0, 40, 10, 100), 0.01, 1e-12);
}

TEST(LearningRateAt, CosineFromPeakToMinimum) {
  ScheduleSpec s;
  s.name = LrScheduleKind::kCosine;
  s.warmup_epochs = 1;
  s.min_lr = 0.1;
  EXPECT_NEAR(LearningRateAt(s, 1.0, 10, 10, 110), 1.0, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, 1.0, 60, 10, 110), 0.55, 1e-12);
  EXPECT_NEAR(LearningRateAt(s, 1.0, 110, 10, 110), 0.1, 1e-12);
  EXPECT_LT(LearningRateAt(s, 1.0, 80, 10, 110), LearningRateAt(s, 1.0, 70, 10, 110));
}

TEST(BaseLearningRate, GoyalRule) {
  OptimizerSpec o;
  o.lr = 0.1;
  EXPECT_DOUBLE_EQ(BaseLearningRate(o, 512, 2), 0.1);
  o.scale_lr_by_batch = true;
  EXPECT_DOUBLE_EQ(BaseLearningRate(o, 512, 2), 0.4);
  EXPECT_DOUBLE_EQ(BaseLearningRate(o, 128), 0.05);
}

// A module with one matrix (decayed) and one bias (not decayed).
struct TwoParams : torch::nn::Module {
  TwoParams() {
    w = register_parameter("w", torch::full({2, 2}, 1.0));
    b = register_parameter("b", torch::full({2}, 1.0));
  }
  torch::Tensor w, b;
};

TEST(MakeOptimizer, WeightDecaySkipsBiasesAndNormParameters) {
  TwoParams m;
  OptimizerSpec o;
  o.lr = 0.1;
  o.momentum = 0;
  o.weight_decay = 0.5;
  auto opt = MakeOptimizer(o, m);
  ASSERT_EQ(opt->param_groups().size(), 2u);
  // Zero gradients: only weight decay moves parameters.
  m.w.mutable_grad() = torch::zeros_like(m.w);
  m.b.mutable_grad() = torch::zeros_like(m.b);
  opt->step();
  EXPECT_TRUE(torch::allclose(m.w, torch::full({2, 2}, 1.0 - 0.1 * 0.5)));
  EXPECT_TRUE(torch::equal(m.b, torch::full({2}, 1.0)));

  TwoParams all;
  o.exclude_bn_and_bias = false;
  auto opt_all = MakeOptimizer(o, all);
  all.w.mutable_grad() = torch::zeros_like(all.w);
  all.b.mutable_grad() = torch::zeros_like(all.b);
  opt_all->step();
  EXPECT_TRUE(torch::allclose(all.b, torch::full({2}, 0.95)));
}

TEST(MakeOptimizer, NesterovMomentumMatchesTheFormula) {
  TwoParams m;
  OptimizerSpec o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  auto opt = MakeOptimizer(o, m);
  torch::Tensor g = torch::tensor({{1.0, -2.0}, {0.5, 3.0}});
  torch::Tensor p = m.w.detach().clone(), v = torch::zeros_like(p);
  for (int step = 0; step < 3; ++step) {
    m.w.mutable_grad() = g.clone();
    m.b.mutable_grad() = torch::zeros_like(m.b);
    opt->step();
    v = step == 0 ? g.clone() : 0.9 * v + g;  // PyTorch: first step v = g
    p = p - 0.1 * (g + 0.9 * v);
  }
  EXPECT_TRUE(torch::allclose(m.w, p, 1e-6, 1e-7));
}

TEST(MakeOptimizer, AdamFirstStepMovesByLearningRate) {
  TwoParams m;
  OptimizerSpec o;
  o.name = OptimizerKind::kAdam;
  o.lr = 0.01;
  auto opt = MakeOptimizer(o, m);
  m.w.mutable_grad() = torch::tensor({{3.0, -2.0}, {0.5, -7.0}});
  m.b.mutable_grad() = torch::zeros_like(m.b);
  opt->step();
  // Bias-corrected first Adam step is lr * sign(g).
  EXPECT_TRUE(torch::allclose(m.w, torch::tensor({{0.99, 1.01}, {0.99, 1.01}}), 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(m.b, torch::full({2}, 1.0)));
}

// Several parameters of different shapes, some without weight decay.
struct Net : torch::nn::Module {
  Net() {
    torch::manual_seed(7);
    for (int i = 0; i < 4; ++i) {
      ps.push_back(register_parameter(absl::StrCat("w", i), torch::randn({3 + i, 5})));
      ps.push_back(register_parameter(absl::StrCat("b", i), torch::randn({3 + i})));
    }
  }
  std::vector<torch::Tensor> ps;
};

// The multi-tensor optimizers step exactly as LibTorch's per-parameter loop:
// the same parameters after many steps (a parameter without a gradient at
// some steps included, with a learning-rate change), the same state, and
// each one's serialized state loads into the other.
TEST(MakeOptimizer, MultiTensorKernelsEqualThePerParameterLoop) {
  struct Case {
    const char* what;
    OptimizerSpec spec;
  };
  std::vector<Case> cases;
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    for (double decay : {0.0, 0.05}) {
      for (bool nesterov : {false, true}) {
        OptimizerSpec o;
        o.name = kind;
        o.lr = kind == OptimizerKind::kAdam ? 1e-2 : 0.1;
        o.weight_decay = decay;
        o.nesterov = nesterov && kind == OptimizerKind::kSgd;
        cases.push_back({kind == OptimizerKind::kAdam ? "adam" : "sgd", o});
      }
    }
  }
  OptimizerSpec plain;
  plain.momentum = 0;
  cases.push_back({"sgd without momentum", plain});
  for (const Case& c : cases) {
    SCOPED_TRACE(
        absl::StrCat(c.what, " weight_decay=", c.spec.weight_decay, " nesterov=", c.spec.nesterov));
    Net loop, multi;
    auto a = MakeOptimizer(c.spec, loop, OptimizerKernels::kPerParameter);
    auto b = MakeOptimizer(c.spec, multi, OptimizerKernels::kMultiTensor);
    ASSERT_TRUE(IsMultiTensor(*b));
    ASSERT_FALSE(IsMultiTensor(*a));
    ASSERT_TRUE(IsMultiTensor(*MakeOptimizer(c.spec, multi)));  // the default
    torch::manual_seed(11);
    for (int step = 0; step < 30; ++step) {
      if (step == 15) {
        SetLearningRate(*a, c.spec.lr / 3);
        SetLearningRate(*b, c.spec.lr / 3);
      }
      for (size_t i = 0; i < loop.ps.size(); ++i) {
        // Parameter 2 has no gradient on every third step (it starts later
        // and skips steps, so its Adam step count differs from the others').
        const bool skip = i == 2 && step % 3 == 0;
        torch::Tensor g = torch::randn_like(loop.ps[i]);
        loop.ps[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
        multi.ps[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
      }
      a->step();
      b->step();
    }
    for (size_t i = 0; i < loop.ps.size(); ++i) {
      EXPECT_LT((loop.ps[i] - multi.ps[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
      EXPECT_GT((loop.ps[i] - Net().ps[i]).abs().max().item<double>(), 1e-3)
          << "parameter " << i << " did not move";
    }
    // The serialized state of one loads into the other and steps the same.
    std::stringstream saved;
    {
      torch::serialize::OutputArchive archive;
      b->save(archive);
      archive.save_to(saved);
    }
    Net again;
    for (size_t i = 0; i < again.ps.size(); ++i) {
      torch::NoGradGuard no_grad;
      again.ps[i].copy_(multi.ps[i]);
    }
    auto c2 = MakeOptimizer(c.spec, again, OptimizerKernels::kPerParameter);
    SetLearningRate(*c2, c.spec.lr / 3);
    {
      torch::serialize::InputArchive archive;
      archive.load_from(saved);
      c2->load(archive);
    }
    for (size_t i = 0; i < again.ps.size(); ++i) {
      torch::Tensor g = torch::randn_like(again.ps[i]);
      again.ps[i].mutable_grad() = g.clone();
      multi.ps[i].mutable_grad() = g.clone();
    }
    c2->step();
    b->step();
    for (size_t i = 0; i < again.ps.size(); ++i) {
      EXPECT_LT((again.ps[i] - multi.ps[i]).abs().max().item<double>(), 1e-6)
          << "parameter " << i << " after a reload";
    }
  }
}

TEST(SetLearningRate, ChangesEveryGroup) {
  TwoParams m;
  OptimizerSpec o;
  o.weight_decay = 1e-4;
  auto opt = MakeOptimizer(o, m);
  SetLearningRate(*opt, 0.0125);
  for (auto& g : opt->param_groups()) EXPECT_DOUBLE_EQ(g.options().get_lr(), 0.0125);
}

// Muon against the reference numbers of tests/fixtures/muon/make_reference.py
// (torch.optim.Muon's documented algorithm in float64, torch.optim.Adam for
// the bias): the same formula-made weights and gradients, three steps, the
// last at half the learning rate; weights and momentum buffers agree to
// float32 precision.
struct MuonFixture : torch::nn::Module {
  static constexpr int kParams = 4;
  MuonFixture() {
    const std::vector<std::vector<int64_t>> shapes = {{4, 3}, {2, 5}, {3, 2, 2, 2}, {4}};
    const char* names[] = {"w_tall", "w_wide", "conv", "bias"};
    for (int k = 0; k < kParams; ++k) {
      const int64_t n = torch::ones(shapes[k]).numel();
      std::vector<float> values;
      for (int64_t i = 0; i < n; ++i) values.push_back(0.5f * std::cos(0.21 * (i + 1) + 0.5 * k));
      params.push_back(register_parameter(names[k], torch::tensor(values).reshape(shapes[k])));
    }
  }
  void SetGradients(int t) {
    for (int k = 0; k < kParams; ++k) {
      std::vector<float> values;
      for (int64_t i = 0; i < params[k].numel(); ++i) {
        values.push_back(static_cast<float>(std::sin(0.37 * (i + 1) + 1.3 * t + 0.11 * k)));
      }
      params[k].mutable_grad() = torch::tensor(values).reshape(params[k].sizes());
    }
  }
  std::vector<torch::Tensor> params;
};

std::map<std::string, std::vector<double>> ReadReference() {
  std::ifstream in(std::string(STAGEWISE_SOURCE_DIR) + "/tests/fixtures/muon/reference.txt");
  std::map<std::string, std::vector<double>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    double v = 0;
    while (fields >> v) out[name].push_back(v);
  }
  return out;
}

void ExpectClose(const torch::Tensor& t, const std::vector<double>& expected,
                 const std::string& what) {
  const torch::Tensor flat = t.detach().reshape({-1}).to(torch::kFloat64);
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.size())) << what;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    EXPECT_NEAR(flat[i].item<double>(), expected[i], 2e-5) << what << "[" << i << "]";
  }
}

TEST(Muon, MatchesTheReferenceImplementationsNumbers) {
  const auto reference = ReadReference();
  ASSERT_EQ(reference.size(), 7u) << "tests/fixtures/muon/reference.txt";
  MuonFixture m;
  OptimizerSpec o;
  o.name = OptimizerKind::kMuon;
  o.lr = 0.02;
  o.adam_lr = 0.003;
  o.momentum = 0.95;
  o.nesterov = true;
  o.weight_decay = 0.01;
  auto opt = MakeOptimizer(o, m);
  ASSERT_EQ(opt->param_groups().size(), 2u);  // the weights, then Adam's bias
  const double scales[] = {1.0, 1.0, 0.5};
  for (int t = 0; t < 3; ++t) {
    SetLearningRate(*opt, o.lr * scales[t]);
    m.SetGradients(t);
    opt->step();
  }
  const char* names[] = {"w_tall", "w_wide", "conv", "bias"};
  for (int k = 0; k < MuonFixture::kParams; ++k) {
    ExpectClose(m.params[k], reference.at(names[k]), names[k]);
  }
  // The weights' momentum buffers are Adam's exp_avg, saved as Adam's are.
  for (int k = 0; k < 3; ++k) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(
        *opt->state().at(models::OptimizerStateKey(m.params[k])));
    ExpectClose(state.exp_avg(), reference.at(std::string("buffer_") + names[k]), names[k]);
    EXPECT_EQ(state.exp_avg_sq().numel(), 0);
  }
}

// The iteration makes a matrix's singular values nearly equal (the update's
// direction without its scale), tall or wide.
TEST(Muon, NewtonSchulzOrthogonalizes) {
  torch::manual_seed(3);
  for (const auto& shape : {std::vector<int64_t>{16, 4}, std::vector<int64_t>{4, 16}}) {
    const torch::Tensor g = torch::randn(shape);
    const torch::Tensor o = OrthogonalizeNewtonSchulz(g, 5);
    ASSERT_EQ(o.sizes(), g.sizes());
    const torch::Tensor s = std::get<1>(torch::svd(o));
    EXPECT_GT(s.min().item<double>(), 0.5) << s;
    EXPECT_LT(s.max().item<double>(), 1.3) << s;
    // Same singular vectors: the update still points the gradient's way.
    EXPECT_GT((o * g).sum().item<double>(), 0);
  }
}

// Muon's learning rate moves its Adam part in proportion (adam_lr / lr).
TEST(Muon, TheScheduleScalesBothParts) {
  MuonFixture m;
  OptimizerSpec o;
  o.name = OptimizerKind::kMuon;
  o.lr = 0.02;
  o.adam_lr = 0.004;
  auto opt = MakeOptimizer(o, m);
  SetLearningRate(*opt, 0.01);
  ASSERT_EQ(opt->param_groups().size(), 2u);
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].options().get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(opt->param_groups()[1].options().get_lr(), 0.002);
}

}  // namespace
}  // namespace stagewise::training
