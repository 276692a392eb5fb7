// Oracles for `features_replay` (docs/algorithms.md; Features Replay, Huo et
// al. 2018, Algorithm 1):
//   - J = 1 equals backprop;
//   - with lr = 0 every stage's gradients equal backprop's for the same
//     mini-batches (stage j sees mini-batches 0 .. T-1-(J-1-j));
//   - with lr > 0 the parameters and BatchNorm statistics after T iterations
//     equal a lock-step single-process simulation of Algorithm 1 written here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise::testing {
namespace {

// RevNet blocks [2, 2, 1, 1]: 8 blocks, even over 3 stages [0,3) [3,6) [6,8).
std::string JobYaml(int stages, int64_t steps, double lr = 0.05, double weight_decay = 1e-4) {
  return absl::StrCat(R"(name: replay-oracle
seed: 7
model: {name: revnet, depth: 18, width: 4, blocks: [2, 2, 1, 1]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
algorithm: features_replay
stages: {count: )",
                      stages, ", partition: even}\noptimizer: {name: sgd, lr: ", lr,
                      ", momentum: 0.9, weight_decay: ", weight_decay, R"(}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: )",
                      steps, "\neval: {every_epochs: 0, at_end: false}\n");
}

// Algorithm 1 in lock step: at iteration t the forward of mini-batch t runs
// through every stage in order; then every stage j < J-1 replays the input of
// mini-batch t-(J-1-j) with its current parameters and backpropagates the
// gradient its successor produced in iteration t-1; the last stage uses its
// fresh loss.
std::map<std::string, torch::Tensor> Simulate(const JobSpec& spec) {
  const Simulation sim = StartSimulation(spec);
  const int64_t per_epoch = sim.per_epoch;
  const int64_t T = spec.steps;
  const int J = sim.stages();
  const double base = training::BaseLearningRate(spec.optimizer, spec.batch_size);
  std::vector<std::shared_ptr<models::Model>> F(J);
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opt(J);
  for (int j = 0; j < J; ++j) {
    F[j] = sim.StageModel(spec, j);
    opt[j] = training::MakeOptimizer(spec.optimizer, *F[j]);
  }
  auto step = [&](int j, int64_t t) {
    training::SetLearningRate(*opt[j],
                              training::LearningRateAt(spec.schedule, base, t, per_epoch, T));
    opt[j]->step();
  };
  std::vector<std::map<int64_t, torch::Tensor>> history(J);
  std::map<int, std::pair<int64_t, torch::Tensor>> delta;  // stage -> (mini-batch, gradient)
  for (int64_t t = 0; t < T; ++t) {
    std::map<int, std::pair<int64_t, torch::Tensor>> next;
    data::Batch b = sim.Batch(t);
    torch::Tensor h = b.x;
    for (int j = 0; j < J; ++j) {
      if (j < J - 1) {
        torch::NoGradGuard g;
        history[j][t] = h;
        h = F[j]->forward(h);
        continue;
      }
      opt[j]->zero_grad();
      if (j > 0) h.requires_grad_(true);
      torch::cross_entropy_loss(F[j]->forward(h), b.y).backward();
      step(j, t);
      if (j > 0) next[j - 1] = {t, h.grad()};
    }
    for (int j = 0; j < J - 1; ++j) {
      if (!delta.count(j)) continue;
      auto [r, d] = delta[j];
      EXPECT_EQ(r, t - (J - 1 - j));
      torch::Tensor x = history[j][r].detach();
      history[j].erase(r);
      opt[j]->zero_grad();
      if (j > 0) x.requires_grad_(true);
      torch::Tensor out;
      {
        models::FreezeRunningStats freeze;
        out = F[j]->forward(x);
      }
      out.backward(d);
      step(j, t);
      if (j > 0) next[j - 1] = {r, x.grad()};
    }
    delta = std::move(next);
  }
  std::map<std::string, torch::Tensor> out;
  for (int j = 0; j < J; ++j) {
    for (auto& [name, v] : Tensors(*F[j])) out[name] = v;
  }
  return out;
}

TEST(FeaturesReplayOracle, OneStageEqualsBackprop) {
  const std::string yaml = JobYaml(1, 6);
  ExpectClose(RunJob(yaml, 1).tensors, testing::ReferenceTensors(yaml));
}

// lr = 0: parameters never move, so every replayed gradient is backprop's for
// its mini-batch. SGD's momentum buffers sum them; stage j has seen
// mini-batches 0 .. T-1-(J-1-j), so it is compared with the reference's
// buffers after that many steps.
void ExpectReplayedGradientsAreBackprops(const std::string& yaml, int J, int64_t T) {
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto momentum = [](torch::optim::Optimizer& opt, const torch::Tensor& p) {
    using Key = std::decay_t<decltype(opt.state())>::key_type;
    auto it = opt.state().find(testing::OptimizerStateKey<Key>(p));
    EXPECT_TRUE(it != opt.state().end());
    return static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().clone();
  };
  auto trainer = CreateReference(*spec);
  ASSERT_TRUE(trainer.ok());
  auto& ref = **trainer;
  std::map<int64_t, std::map<std::string, torch::Tensor>> after;  // steps done -> buffers
  for (int64_t s = 0; s < T; ++s) {
    ref.Step(ref.train_sampler().Get(0, s), 0.0);
    for (const auto& item : ref.model().named_parameters()) {
      after[s + 1][item.key()] = momentum(ref.optimizer(), item.value());
    }
  }

  testing::Cluster cluster({.workers = J});
  ASSERT_TRUE(cluster.WaitForWorkers(J));
  auto id = cluster.manager().Submit(yaml);
  ASSERT_TRUE(id.ok());
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  int compared = 0;
  for (auto& w : cluster.workers()) {
    auto rt = w->runtime();
    const int64_t seen = T - (J - 1 - rt->stage());
    std::map<std::string, torch::Tensor> got, want;
    for (const auto& item : rt->model().named_parameters()) {
      got[item.key()] = momentum(rt->optimizer(), item.value());
      want[item.key()] = after[seen].at(item.key());
    }
    ExpectClose(got, want);
    ++compared;
  }
  EXPECT_EQ(compared, J);
  // Stage j keeps J-j inputs and is J-1-j steps stale.
  for (int j = 0; j < J - 1; ++j) {
    EXPECT_EQ(st->summary().at(absl::StrCat("stage", j, ".peak_inputs")), J - j);
    EXPECT_EQ(st->summary().at(absl::StrCat("stage", j, ".staleness_steps")), J - 1 - j);
  }
}

TEST(FeaturesReplayOracle, ZeroLearningRateGivesBackpropGradients) {
  ExpectReplayedGradientsAreBackprops(JobYaml(3, 6, /*lr=*/0.0, /*weight_decay=*/0.0), 3, 6);
}

// The same on the byte-level GPT (docs/text.md).
TEST(FeaturesReplayOracle, ZeroLearningRateGivesBackpropGradientsOnTheGpt) {
  ExpectReplayedGradientsAreBackprops(GptJobYaml(2, "features_replay", 0.0, 5), 2, 5);
}

TEST(FeaturesReplayOracle, EqualsTheLockStepSimulationOfAlgorithm1) {
  const std::string yaml = JobYaml(3, 12);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectClose(RunJob(yaml, 3).tensors, Simulate(*spec));
}

}  // namespace
}  // namespace stagewise::testing
