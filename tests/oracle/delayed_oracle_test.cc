// Oracles for `delayed` (docs/algorithms.md): J = 1 equals backprop; with J > 1 the
// parameters after S steps equal a single-process simulation of delayed SGD
// written here: every stage runs d_j = 2(J-1-j)+1 mini-batches in flight in
// 1F1B order, stores inputs (and stashes parameters), recomputes with them
// when the gradient returns and applies it to the current parameters (with
// `accumulation: k`, the mean of every k such gradients). The job runs both
// forms, `forward: once` (the graph kept at a stash, the default with
// stash) and `forward: recompute`, against that one simulation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise {
namespace {

// `corrections`: more keys of the algorithm map, e.g. ", predict_weights: true".
std::string JobYaml(int stages, const std::string& weights, int64_t steps,
                    const std::string& corrections = "") {
  return absl::StrCat(R"(name: delayed-oracle
seed: 3
model: {name: revnet, depth: 18, width: 4, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
algorithm: {name: delayed, weights: )",
                      weights, corrections, "}\nstages: ", stages, R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: )",
                      steps, "\neval: {every_epochs: 0, at_end: false}\n");
}

std::map<std::string, torch::Tensor> RunJob(const std::string& yaml, int stages,
                                            double link_delay_ms = 0) {
  testing::Cluster cluster({.workers = stages, .link_delay_ms = link_delay_ms});
  EXPECT_TRUE(cluster.WaitForWorkers(stages));
  auto id = cluster.manager().Submit(yaml);
  EXPECT_TRUE(id.ok()) << id.status();
  auto st = cluster.WaitForJob(*id);
  EXPECT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  return cluster.StageTensors(*id, /*buffers=*/false);
}

using testing::ExpectClose;

// The single-process simulation: a discrete-event loop over J stage models,
// with the staleness corrections of `o` (predicted weights: the forward and
// its stash at w + s (w - w_prev); the learning rate scaled by the delay).
std::map<std::string, torch::Tensor> Simulate(const JobSpec& spec, const DelayedOptions& o) {
  const bool stash = o.weights == DelayedWeights::kStash;
  const testing::Simulation sim = testing::StartSimulation(spec);
  const int64_t per_epoch = sim.per_epoch;
  const int64_t S = spec.steps;
  const int J = sim.stages();
  const int64_t k = o.accumulation;
  const double base = training::BaseLearningRate(spec.optimizer, spec.batch_size, k);

  struct Sim {
    std::shared_ptr<models::Model> model;
    std::unique_ptr<torch::optim::Optimizer> opt;
    std::vector<torch::Tensor> params;
    int64_t depth = 1, next_f = 0, next_b = 0, backwards = 0;
    std::map<int64_t, std::pair<torch::Tensor, std::vector<torch::Tensor>>> stored;
    std::map<int64_t, std::pair<torch::Tensor, torch::Tensor>> fwd_in;  // x, labels
    std::map<int64_t, torch::Tensor> bwd_in;
    testing::SimulatedCorrections c;
  };
  std::vector<Sim> st(J);
  for (int j = 0; j < J; ++j) {
    st[j].model = sim.StageModel(spec, j);
    st[j].opt = training::MakeOptimizer(spec.optimizer, *st[j].model);
    st[j].params = st[j].model->parameters();
    st[j].depth = 2 * (J - 1 - j) + 1;
    const double delay =
        j == J - 1 ? 0 : static_cast<double>(st[j].depth - 1) / static_cast<double>(k);
    st[j].c =
        testing::SimulatedCorrections(delay, o.lr_by_delay, o.momentum_by_delay, o.predict_weights);
  }
  auto step = [&](Sim& s) {
    if (++s.backwards % k != 0) return;  // the window stays open
    {
      torch::NoGradGuard ng;
      for (auto& p : s.params) {
        if (p.grad().defined()) p.grad().div_(static_cast<double>(k));
      }
    }
    s.c.Step(*s.opt, s.params,
             training::LearningRateAt(spec.schedule, base, s.backwards - k, per_epoch, S),
             spec.optimizer.name == OptimizerKind::kAdam ? spec.optimizer.beta1
                                                         : spec.optimizer.momentum);
    s.opt->zero_grad();
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < J; ++j) {
      Sim& s = st[j];
      const bool last = j == J - 1;
      const int64_t t = s.next_f;
      const bool want_forward = t < S && (last || t - s.next_b < s.depth);
      if (want_forward && (j == 0 || s.fwd_in.count(t))) {
        auto [x, y] = sim.TakeInput(j, t, s.fwd_in);
        if (last) {
          if (j > 0) x.requires_grad_(true);
          torch::cross_entropy_loss(s.model->forward(x), y).backward();
          step(s);
          if (j > 0) st[j - 1].bwd_in[t] = x.grad();
          ++s.next_b;
        } else {
          const std::vector<torch::Tensor> now = s.c.Predict(s.params);
          torch::Tensor out;
          {
            torch::NoGradGuard g;
            out = s.model->forward(x);
          }
          std::vector<torch::Tensor> copy;
          if (stash) {
            for (auto& p : s.params) copy.push_back(p.detach().clone());
          }
          testing::SimulatedCorrections::Restore(s.params, now);
          s.stored[t] = {x, copy};
          st[j + 1].fwd_in[t] = {out, y};
        }
        ++s.next_f;
        progress = true;
        continue;
      }
      const int64_t b = s.next_b;
      if (!last && b < S && !want_forward && s.bwd_in.count(b)) {
        auto [x, copy] = s.stored[b];
        s.stored.erase(b);
        torch::Tensor g = s.bwd_in[b];
        s.bwd_in.erase(b);
        if (j > 0) x.requires_grad_(true);
        std::vector<torch::Tensor> now;
        if (stash) {
          torch::NoGradGuard ng;
          for (size_t i = 0; i < s.params.size(); ++i) {
            now.push_back(s.params[i].detach().clone());
            s.params[i].copy_(copy[i]);
          }
        }
        torch::Tensor out;
        {
          models::FreezeRunningStats freeze;
          out = s.model->forward(x);
        }
        out.backward(g);
        if (stash) {
          torch::NoGradGuard ng;
          for (size_t i = 0; i < s.params.size(); ++i) s.params[i].copy_(now[i]);
        }
        step(s);
        if (j > 0) st[j - 1].bwd_in[b] = x.grad();
        ++s.next_b;
        progress = true;
      }
    }
  }
  std::map<std::string, torch::Tensor> out;
  for (int j = 0; j < J; ++j) {
    EXPECT_EQ(st[j].backwards, S) << "stage " << j;
    for (const auto& item : st[j].model->named_parameters())
      out[item.key()] = item.value().detach();
  }
  return out;
}

TEST(DelayedOracle, OneStageEqualsBackprop) {
  const std::string yaml = JobYaml(1, "stash", 6);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto trainer = testing::CreateReference(*spec);
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Run().ok());
  std::map<std::string, torch::Tensor> want;
  for (const auto& item : (*trainer)->model().named_parameters()) want[item.key()] = item.value();
  ExpectClose(RunJob(yaml, 1), want);
}

// docs/algorithms.md, "delayed": stage j holds up to 2(J-1-j)+1 inputs (and, stashing, as many
// parameter versions) and its gradients are 2(J-1-j) steps stale.
TEST(DelayedBuffers, StageJHoldsTwiceItsDistanceToTheEndPlusOneInputs) {
  const std::string yaml = JobYaml(3, "stash", 12);
  testing::Cluster cluster({.workers = 3});
  ASSERT_TRUE(cluster.WaitForWorkers(3));
  auto id = cluster.manager().Submit(yaml);
  ASSERT_TRUE(id.ok());
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  const auto& summary = st->summary();
  for (int j = 0; j < 2; ++j) {
    const std::string stage = absl::StrCat("stage", j, ".");
    ASSERT_TRUE(summary.count(stage + "peak_inputs")) << stage;
    EXPECT_EQ(summary.at(stage + "peak_inputs"), 2 * (3 - 1 - j) + 1) << stage;
    EXPECT_EQ(summary.at(stage + "peak_stashed_versions"), 2 * (3 - 1 - j) + 1) << stage;
    EXPECT_EQ(summary.at(stage + "staleness_steps"), 2 * (3 - 1 - j)) << stage;
    EXPECT_GT(summary.at(stage + "peak_input_bytes"), 0) << stage;
  }
  EXPECT_FALSE(summary.count("stage2.peak_inputs"));  // the last stage stores nothing
  EXPECT_GT(summary.at("stage2.bytes_sent"), 0);
}

// With lr = 0 the parameters never move, so every gradient must be backprop's
// for the same mini-batch; SGD's momentum buffers accumulate them, so equal
// buffers after S steps mean equal gradient sequences.
TEST(DelayedOracle, ZeroLearningRateGivesBackpropGradients) {
  std::string yaml = JobYaml(3, "stash", 6);
  yaml.replace(yaml.find("lr: 0.05"), 8, "lr: 0.0");
  yaml.replace(yaml.find("weight_decay: 1.0e-4"), 20, "weight_decay: 0.0");
  const testing::MomentumOutcome run = testing::RunMomentumOracle(yaml, 3);
  ASSERT_EQ(run.status.state(), v1::SUCCEEDED) << run.status.reason();
  ExpectClose(run.got, run.want);
}

struct TrajectoryCase {
  TrajectoryCase(std::string w, std::string c, std::string n, std::string o = "")
      : weights(std::move(w)), corrections(std::move(c)), name(std::move(n)), optimizer(o) {}
  std::string weights;
  std::string corrections;  // more keys of the algorithm map
  std::string name;
  std::string optimizer;  // instead of the job's SGD, e.g. "{name: adam, lr: 0.01}"
};

class DelayedTrajectory : public ::testing::TestWithParam<TrajectoryCase> {};

TEST_P(DelayedTrajectory, EqualsTheSingleProcessSimulation) {
  const TrajectoryCase& c = GetParam();
  std::string yaml = JobYaml(3, c.weights, 10, c.corrections);
  if (!c.optimizer.empty()) {
    const std::string sgd = "{name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}";
    yaml.replace(yaml.find(sgd), sgd.size(), c.optimizer);
  }
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const DelayedOptions options = std::get<DelayedOptions>(spec->algorithm.options);
  auto want = Simulate(*spec, options);
  ExpectClose(RunJob(yaml, 3), want);
  // The test tells the variants apart: the other weight policy's trajectory
  // differs, and so does the plain rule's where a correction is on.
  DelayedOptions other = options;
  other.weights =
      other.weights == DelayedWeights::kStash ? DelayedWeights::kCurrent : DelayedWeights::kStash;
  other.predict_weights = false;
  EXPECT_GT(testing::MaxDifference(want, Simulate(*spec, other)), 1e-4);
  const bool corrected = options.predict_weights || options.lr_by_delay != DelayLr::kConstant ||
                         options.momentum_by_delay != DelayMomentum::kConstant ||
                         options.accumulation != 1;
  if (corrected) {
    DelayedOptions plain = options;
    plain.predict_weights = false;
    plain.lr_by_delay = DelayLr::kConstant;
    plain.momentum_by_delay = DelayMomentum::kConstant;
    plain.accumulation = 1;
    EXPECT_GT(testing::MaxDifference(want, Simulate(*spec, plain)), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Weights, DelayedTrajectory,
    ::testing::Values(
        // forward: auto, which is once with stash
        TrajectoryCase{"stash", "", "stash"},
        // the two forms of a stashing forward: one trajectory
        TrajectoryCase{"stash", ", forward: once", "stash_once"},
        TrajectoryCase{"stash", ", forward: recompute", "stash_recompute"},
        TrajectoryCase{"stash", ", forward: recompute, predict_weights: true",
                       "predicted_recompute"},
        TrajectoryCase{"current", "", "current"},
        // the staleness corrections, alone and together
        TrajectoryCase{"stash", ", predict_weights: true", "predicted"},
        TrajectoryCase{"current", ", lr_by_delay: inverse", "current_lr_inverse"},
        TrajectoryCase{"stash", ", momentum_by_delay: compensate", "compensated"},
        // Adam: compensate lowers beta1
        TrajectoryCase{"stash", ", momentum_by_delay: compensate", "adam_compensated",
                       "{name: adam, lr: 0.01}"},
        TrajectoryCase{"stash", ", predict_weights: true, lr_by_delay: inverse_sqrt",
                       "predicted_lr_inverse_sqrt"},
        // bounded accumulation (PACI): current weights, a step every 2 (the
        // last window of 10 steps closes); stashed, every 3 (it stays open)
        TrajectoryCase{"current", ", accumulation: 2", "accumulated"},
        TrajectoryCase{"stash", ", accumulation: 3, momentum_by_delay: compensate",
                       "accumulated_compensated"}),
    [](const ::testing::TestParamInfo<TrajectoryCase>& info) { return info.param.name; });

// An emulated link latency (worker --emulate-link-delay-ms) delays every
// message and changes nothing else: order and flow control are kept, so the
// trajectory is the simulation's, for both forms of the forward.
TEST(DelayedOracle, ALinkLatencyChangesNothingButTime) {
  for (const std::string forward : {"once", "recompute"}) {
    const std::string yaml = JobYaml(3, "stash", 8, ", forward: " + forward);
    auto spec = ParseJobSpec(yaml);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const DelayedOptions options = std::get<DelayedOptions>(spec->algorithm.options);
    ExpectClose(RunJob(yaml, 3, /*link_delay_ms=*/15), Simulate(*spec, options));
  }
}

// The same on the byte-level GPT: with lr = 0 the delayed pipeline computes
// backprop's gradients for sequences of bytes too.
TEST(DelayedOracle, ZeroLearningRateGivesBackpropGradientsOnTheGpt) {
  const testing::MomentumOutcome run =
      testing::RunMomentumOracle(testing::GptJobYaml(2, "delayed", 0.0, 5), 2);
  ASSERT_EQ(run.status.state(), v1::SUCCEEDED) << run.status.reason();
  testing::ExpectClose(run.got, run.want);
}

}  // namespace
}  // namespace stagewise
