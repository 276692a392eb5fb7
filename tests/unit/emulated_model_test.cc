// The emulated-accelerator model: layout, waits, gradients and inverses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "services/models/blocks.h"
#include "services/models/emulated_kernels.h"
#include "services/models/modal_pass.h"
#include "services/models/model.h"

namespace stagewise::models {
namespace {

ModelSpec Emulated(int depth, bool reversible, std::vector<int64_t> shape = {4, 3, 3}) {
  ModelSpec s;
  s.name = ModelKind::kEmulated;
  s.depth = depth;
  s.forward_ms = 8;
  s.backward_ms = 16;
  s.reversible = reversible;
  s.batch_size = 8;
  s.input_shape = std::move(shape);
  s.num_classes = 5;
  return s;
}

TEST(EmulatedModel, PlanHasDepthBlocksAndAHead) {
  auto plan = PlanModel(Emulated(3, true));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);
  for (int i = 0; i < 3; ++i) {
    const BlockInfo& b = (*plan)[i];
    EXPECT_EQ(b.kind, "emulated");
    EXPECT_TRUE(b.reversible);
    EXPECT_EQ(b.in_shape, (std::vector<int64_t>{4, 3, 3}));
    EXPECT_EQ(b.out_shape, b.in_shape);
    // 8 ms per mini-batch of 8 samples: 1 ms per sample.
    EXPECT_DOUBLE_EQ(b.forward_seconds_per_sample, 1e-3);
    EXPECT_DOUBLE_EQ(b.backward_seconds_per_sample, 2e-3);
  }
  EXPECT_EQ(plan->back().kind, "head");
  EXPECT_EQ(plan->back().out_shape, (std::vector<int64_t>{5}));
}

// Per-block times (model.block_forward_ms / block_backward_ms) replace the
// scalars block by block; a list whose length is not the depth is refused,
// naming the key.
TEST(EmulatedModel, PerBlockTimesReplaceTheScalars) {
  ModelSpec s = Emulated(3, false);
  s.block_forward_ms = {8, 16, 0};
  s.block_backward_ms = {24, 8, 4};
  auto plan = PlanModel(s);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);
  const double forward[] = {1e-3, 2e-3, 0}, backward[] = {3e-3, 1e-3, 0.5e-3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ((*plan)[i].forward_seconds_per_sample, forward[i]) << i;
    EXPECT_DOUBLE_EQ((*plan)[i].backward_seconds_per_sample, backward[i]) << i;
  }
  s.block_backward_ms = {1, 2};
  auto bad = PlanModel(s);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.block_backward_ms"), std::string::npos)
      << bad.status();
}

// --emulated-speed: a thread's emulated waits are its speed's share of the
// configured time; scopes nest and restore, other threads keep theirs, and
// a speed that is not positive changes nothing.
TEST(EmulatedModel, SpeedScalesThisThreadsWaits) {
  EXPECT_DOUBLE_EQ(EmulatedSpeed(), 1.0);
  EXPECT_DOUBLE_EQ(EmulatedSeconds(0.01), 0.01);
  {
    ScopedEmulatedSpeed half(0.5);
    EXPECT_DOUBLE_EQ(EmulatedSeconds(0.01), 0.02);
    {
      ScopedEmulatedSpeed fast(4);
      EXPECT_DOUBLE_EQ(EmulatedSeconds(0.01), 0.0025);
      ScopedEmulatedSpeed ignored(0.0);
      EXPECT_DOUBLE_EQ(EmulatedSpeed(), 4.0);
    }
    EXPECT_DOUBLE_EQ(EmulatedSpeed(), 0.5);
    double other = 0;
    std::thread([&] { other = EmulatedSpeed(); }).join();
    EXPECT_DOUBLE_EQ(other, 1.0);
  }
  EXPECT_DOUBLE_EQ(EmulatedSpeed(), 1.0);
}

// --emulated-speed-file: a scope on a shared speed reads it at every wait,
// so the worker can change it while a stage runs; not positive: the plain
// speed holds.
TEST(EmulatedModel, ASharedSpeedIsReadAtEveryWait) {
  std::atomic<double> speed{1.0};
  ScopedEmulatedSpeed base(2.0);
  {
    ScopedEmulatedSpeed shared(&speed);
    EXPECT_DOUBLE_EQ(EmulatedSeconds(0.01), 0.01);
    speed.store(0.5);
    EXPECT_DOUBLE_EQ(EmulatedSeconds(0.01), 0.02);
    speed.store(0);
    EXPECT_DOUBLE_EQ(EmulatedSpeed(), 2.0);
    {
      ScopedEmulatedSpeed plain(4.0);  // a plain scope inside wins
      speed.store(0.5);
      EXPECT_DOUBLE_EQ(EmulatedSpeed(), 4.0);
    }
    EXPECT_DOUBLE_EQ(EmulatedSpeed(), 0.5);
  }
  EXPECT_DOUBLE_EQ(EmulatedSpeed(), 2.0);
}

TEST(EmulatedModel, RefusesWhatItCannotRun) {
  auto odd = PlanModel(Emulated(2, true, {3, 4, 4}));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("model.reversible"), std::string::npos) << odd.status();
  EXPECT_TRUE(PlanModel(Emulated(2, false, {3, 4, 4})).ok());  // odd is fine without coupling
  ModelSpec no_batch = Emulated(2, true);
  no_batch.batch_size = 0;
  EXPECT_FALSE(PlanModel(no_batch).ok());
}

TEST(EmulatedModel, ParametersAreAScaleAndAShiftPerValue) {
  auto rev = BuildModel(Emulated(2, true), 1);
  ASSERT_TRUE(rev.ok()) << rev.status();
  // Reversible: one stream of [2, 3, 3] per block, scale + shift; head 4*5+5.
  EXPECT_EQ((*rev)->num_parameters(), 2 * (2 * 18) + 25);
  auto plain = BuildModel(Emulated(2, false), 1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->num_parameters(), 2 * (2 * 36) + 25);
}

// A wait can end late but never early: these are lower bounds only.
TEST(EmulatedModel, ForwardAndBackwardTakeAtLeastTheirTimePerSample) {
  auto model = BuildModel(Emulated(1, false), 1, 0, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  torch::Tensor x = torch::randn({4, 4, 3, 3}, torch::requires_grad());
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor y = (*model)->forward(x);
  const auto t1 = std::chrono::steady_clock::now();
  y.sum().backward();
  const auto t2 = std::chrono::steady_clock::now();
  // 4 samples: 4 ms forward, 8 ms backward.
  EXPECT_GE(std::chrono::duration<double>(t1 - t0).count(), 4e-3);
  EXPECT_GE(std::chrono::duration<double>(t2 - t1).count(), 8e-3);
}

// The hand-written backward equals autograd of the same expression.
TEST(EmulatedModel, GradientsMatchAutogradOfTheSameMap) {
  for (bool reversible : {false, true}) {
    auto model = BuildModel(Emulated(1, reversible), 3, 0, 1);
    ASSERT_TRUE(model.ok()) << model.status();
    auto& block = *(*model)->blocks().front();
    auto params = block.named_parameters();
    torch::Tensor scale = params["scale"].detach().clone().requires_grad_(true);
    torch::Tensor shift = params["shift"].detach().clone().requires_grad_(true);
    torch::Tensor x = torch::randn({2, 4, 3, 3});
    torch::Tensor g = torch::randn({2, 4, 3, 3});

    torch::Tensor xa = x.clone().requires_grad_(true);
    block.forward(xa).backward(g);

    torch::Tensor xb = x.clone().requires_grad_(true);
    torch::Tensor expect;
    if (reversible) {
      auto pair = xb.chunk(2, 1);
      expect = torch::cat({pair[1] + pair[0] * scale + shift, pair[0]}, 1);
    } else {
      expect = xb + xb * scale + shift;
    }
    expect.backward(g);
    EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-5, 1e-6)) << "reversible " << reversible;
    EXPECT_TRUE(torch::allclose(params["scale"].grad(), scale.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(params["shift"].grad(), shift.grad(), 1e-5, 1e-6));
  }
}

TEST(EmulatedModel, ReversibleBlocksRebuildTheirInput) {
  auto model = BuildModel(Emulated(2, true), 5);
  ASSERT_TRUE(model.ok()) << model.status();
  for (const auto& block : (*model)->blocks()) {
    if (!block->reversible()) continue;
    torch::NoGradGuard no_grad;
    torch::Tensor x = torch::randn({3, 4, 3, 3});
    EXPECT_TRUE(torch::allclose(block->inverse(block->forward(x)), x, 1e-5, 1e-6));
  }
  // The rebuild-and-differentiate path the rebuild mode and PETRA take.
  auto* rev = static_cast<ReversibleBlock*>((*model)->blocks().front().get());
  torch::Tensor x = torch::randn({3, 4, 3, 3});
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = rev->forward(x);
  }
  auto [rebuilt, dx] = RebuildBackward(*rev, y, torch::ones_like(y), true);
  EXPECT_TRUE(torch::allclose(rebuilt, x, 1e-5, 1e-6));
  EXPECT_EQ(dx.sizes(), x.sizes());
}

// The fused reversible coupling answers a backward for the input alone (B of
// a zero-bubble schedule) and one for the weights alone (W) with the numbers
// of the whole backward; its rebuild accumulates the same parameter gradients.
TEST(EmulatedModel, ReversibleCouplingSplitsItsBackwardAndRebuildsTheSameGradients) {
  auto model = BuildModel(Emulated(1, true), 7, 0, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto* rev = static_cast<ReversibleBlock*>((*model)->blocks().front().get());
  auto params = rev->named_parameters();
  torch::Tensor scale = params["scale"];
  torch::Tensor shift = params["shift"];
  torch::Tensor x = torch::randn({3, 4, 3, 3});
  torch::Tensor g = torch::randn({3, 4, 3, 3});

  // The reference: the same map written with chunk, add and cat.
  torch::Tensor xr = x.clone().requires_grad_(true);
  torch::Tensor sr = scale.detach().clone().requires_grad_(true);
  torch::Tensor hr = shift.detach().clone().requires_grad_(true);
  auto pair = xr.chunk(2, 1);
  torch::cat({pair[1] + pair[0] * sr + hr, pair[0]}, 1).backward(g);

  torch::Tensor xa = x.clone().requires_grad_(true);
  torch::Tensor y = rev->forward(xa);
  auto input_only = torch::autograd::grad({y}, {xa}, {g}, /*retain_graph=*/true);
  EXPECT_TRUE(torch::allclose(input_only[0], xr.grad(), 1e-5, 1e-6));
  auto weights_only = torch::autograd::grad({y}, {scale, shift}, {g});
  EXPECT_TRUE(torch::allclose(weights_only[0], sr.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(weights_only[1], hr.grad(), 1e-5, 1e-6));

  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = rev->forward(x);
  }
  rev->zero_grad();
  auto [rebuilt, dx] = RebuildBackward(*rev, out, g, true);
  EXPECT_TRUE(torch::allclose(rebuilt, x, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(dx, xr.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(scale.grad(), sr.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(shift.grad(), hr.grad(), 1e-5, 1e-6));
}

// The rebuild waits a forward and a backward, counted from its start (a lower
// bound only: a wait can end late, never early).
TEST(EmulatedModel, ARebuildTakesAtLeastAForwardAndABackward) {
  auto model = BuildModel(Emulated(1, true), 1, 0, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto* rev = static_cast<ReversibleBlock*>((*model)->blocks().front().get());
  torch::Tensor y = torch::randn({4, 4, 3, 3});
  const auto t0 = std::chrono::steady_clock::now();
  auto rebuilt = RebuildBackward(*rev, y, torch::ones_like(y), true);
  const auto t1 = std::chrono::steady_clock::now();
  // 4 samples of a batch of 8: 4 ms forward, 8 ms backward.
  EXPECT_GE(std::chrono::duration<double>(t1 - t0).count(), 12e-3);
}

// A compute thread's window defers the waits to its flush, which waits at
// least their sum from the first op (a lower bound only); a rebuild inside it
// adds its waits to the window instead of sleeping them itself; with nothing
// deferred, or no window, a flush has nothing to wait.
TEST(EmulatedModel, AWaitWindowDefersTheWaitsToItsFlush) {
  EXPECT_FALSE(FlushEmulatedWaits()) << "no window on this thread";
  auto model = BuildModel(Emulated(1, false), 1, 0, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  auto rev_model = BuildModel(Emulated(1, true), 1, 0, 1);
  ASSERT_TRUE(rev_model.ok()) << rev_model.status();
  auto* rev = static_cast<ReversibleBlock*>((*rev_model)->blocks().front().get());
  {
    EmulatedWaitWindow window;
    EXPECT_FALSE(FlushEmulatedWaits()) << "nothing computed yet";
    torch::Tensor x = torch::randn({4, 4, 3, 3}, torch::requires_grad());
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor y = (*model)->forward(x);
    y.sum().backward();
    EXPECT_TRUE(FlushEmulatedWaits());
    const auto t1 = std::chrono::steady_clock::now();
    // 4 samples: 4 ms forward and 8 ms backward, from the forward's start.
    EXPECT_GE(std::chrono::duration<double>(t1 - t0).count(), 12e-3);
    EXPECT_FALSE(FlushEmulatedWaits()) << "waited once";

    torch::Tensor z = torch::randn({4, 4, 3, 3});
    auto rebuilt = RebuildBackward(*rev, z, torch::ones_like(z), true);
    EXPECT_TRUE(FlushEmulatedWaits()) << "the rebuild's waits went to the window";
  }
  EXPECT_FALSE(FlushEmulatedWaits()) << "the window is gone";
}

// The fused loops (float32 on the CPU) and LibTorch's ops (anything else) give
// the formulas' values: on two threads, with more values per sample than one
// task takes (so the batch sums are split across tasks), on a strided input
// (LibTorch's path), on half of the channels of a larger tensor (a reversible
// block's stream: the fused loops read it where it is), and in float64.
TEST(EmulatedKernels, AffineMatchesItsFormulaOnEveryPath) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (std::string layout : {"contiguous", "permuted", "half"}) {
      for (bool residual : {false, true}) {
        const auto o = torch::TensorOptions().dtype(dtype);
        // 3 samples of 8 x 64 x 64 values (32768 per sample).
        torch::Tensor x = torch::randn({3, 64, 64, 8}, o).permute({0, 3, 1, 2});
        torch::Tensor g = torch::randn({3, 8, 64, 64}, o);
        if (layout == "contiguous") x = x.contiguous();
        if (layout == "half") {
          x = torch::randn({3, 16, 64, 64}, o).narrow(1, 8, 8);
          g = torch::randn({3, 16, 64, 64}, o).narrow(1, 0, 8);
        }
        torch::Tensor scale = torch::randn({8, 64, 64}, o), shift = torch::randn({8, 64, 64}, o);
        torch::Tensor y = EmulatedAffineForward(x, scale, shift, residual);
        torch::Tensor want = shift + scale * x + (residual ? x : torch::zeros_like(x));
        EXPECT_TRUE(torch::allclose(y, want, 1e-5, 1e-6)) << dtype << layout << residual;
        for (auto [input, weights] : {std::pair{true, true}, {true, false}, {false, true}}) {
          EmulatedGrads d = EmulatedAffineBackward(g, x, scale, residual, input, weights);
          ASSERT_EQ(d.x.defined(), input);
          ASSERT_EQ(d.scale.defined(), weights);
          ASSERT_EQ(d.shift.defined(), weights);
          if (input) {
            EXPECT_TRUE(
                torch::allclose(d.x, g * scale + (residual ? g : torch::zeros_like(g)), 1e-5, 1e-6))
                << dtype << layout << residual;
          }
          if (weights) {
            EXPECT_TRUE(torch::allclose(d.scale, (g * x).sum(0), 1e-5, 1e-5))
                << dtype << layout << residual;
            EXPECT_TRUE(torch::allclose(d.shift, g.sum(0), 1e-5, 1e-5))
                << dtype << layout << residual;
          }
        }
      }
    }
  }
  at::set_num_threads(threads);
}

TEST(EmulatedKernels, CouplingMatchesItsFormulaOnEveryPath) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (bool strided : {false, true}) {
      const auto o = torch::TensorOptions().dtype(dtype);
      torch::Tensor x = torch::randn({3, 64, 64, 16}, o).permute({0, 3, 1, 2});
      if (!strided) x = x.contiguous();
      torch::Tensor scale = torch::randn({8, 64, 64}, o), shift = torch::randn({8, 64, 64}, o);
      torch::Tensor g = torch::randn({3, 16, 64, 64}, o);
      auto xs = x.chunk(2, 1);
      auto gs = g.chunk(2, 1);
      torch::Tensor y = EmulatedCouplingForward(x, scale, shift);
      EXPECT_TRUE(
          torch::allclose(y, torch::cat({xs[1] + shift + scale * xs[0], xs[0]}, 1), 1e-5, 1e-6))
          << dtype << strided;
      for (auto [input, weights] : {std::pair{true, true}, {true, false}, {false, true}}) {
        EmulatedGrads d = EmulatedCouplingBackward(g, x, scale, input, weights);
        ASSERT_EQ(d.x.defined(), input);
        ASSERT_EQ(d.scale.defined(), weights);
        if (input) {
          EXPECT_TRUE(
              torch::allclose(d.x, torch::cat({gs[1] + scale * gs[0], gs[0]}, 1), 1e-5, 1e-6));
        }
        if (weights) {
          EXPECT_TRUE(torch::allclose(d.scale, (gs[0] * xs[0]).sum(0), 1e-5, 1e-5));
          EXPECT_TRUE(torch::allclose(d.shift, gs[0].sum(0), 1e-5, 1e-5));
        }
      }
    }
  }
  at::set_num_threads(threads);
}

// The head's pooling hands its gradient on as an expanded view: the same
// values as LibTorch's mean, forward and backward.
TEST(HeadBlock, PoolingGradientsEqualThoseOfTheMean) {
  BlockInfo info;
  info.kind = "head";
  info.in_channels = 6;
  info.out_channels = 3;
  HeadBlock head(info);
  auto params = head.named_parameters();
  torch::Tensor w = params["fc.weight"].detach().clone().requires_grad_(true);
  torch::Tensor b = params["fc.bias"].detach().clone().requires_grad_(true);
  torch::Tensor x = torch::randn({4, 6, 5, 7});
  torch::Tensor g = torch::randn({4, 3});

  torch::Tensor xa = x.clone().requires_grad_(true);
  torch::Tensor ya = head.forward(xa);
  ya.backward(g);
  torch::Tensor xr = x.clone().requires_grad_(true);
  torch::Tensor yr = torch::nn::functional::linear(xr.mean({2, 3}), w, b);
  yr.backward(g);
  EXPECT_TRUE(torch::equal(ya, yr));
  EXPECT_TRUE(torch::equal(xa.grad(), xr.grad()));
  EXPECT_TRUE(torch::equal(params["fc.weight"].grad(), w.grad()));
}

}  // namespace
}  // namespace stagewise::models
