// Oracles for `nwise` (docs/algorithms.md; Interlocking Backpropagation,
// Gomez, Key et al., Sec. 3):
//   - n = J equals backprop on the main parameters (M = 1 against the
//     reference trainer, M = 2 against distributed backprop with M = 2);
//   - n = 1 equals per-stage local training on detached inputs, and sends no
//     backward traffic at all (byte counters);
//   - n = 2 with J = 4 (and mix_local with J = 3) equals a single-process
//     reference of the rule written here: stage j's main gradient is the
//     gradient of L_{min(j+n-1, J-1)} with respect to its parameters, taken
//     through a recomputation of the stages in between.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "services/models/aux_head.h"
#include "services/models/batch_norm.h"
#include "services/models/loss.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise::testing {
namespace {

// ResNet-8 (CIFAR style, 1 block per group): stem, 3 residual blocks, head =
// 5 blocks; J = 4 takes [0,2) [2,3) [3,4) [4,5) with the even split.
std::string JobYaml(int stages, const std::string& algorithm, int64_t steps) {
  return absl::StrCat(R"(name: nwise-oracle
seed: 11
model: {name: resnet, depth: 8, width: 4}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
algorithm: )",
                      algorithm, "\nstages: {count: ", stages, ", partition: even}", R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: )",
                      steps, "\neval: {every_epochs: 0, at_end: false}\n");
}

// The rule in one process, M = 1. Stage j's main gradient: the gradient of
// L_{min(j+n-1, J-1)} (and, with mix_local, the mean with L_j's) through
// stages j..m recomputed from its detached input; the aux head of stage m is
// trained by L_m alone.
std::map<std::string, torch::Tensor> Reference(const JobSpec& spec, int64_t n, bool mix_local) {
  const Simulation sim = StartSimulation(spec);
  const int64_t per_epoch = sim.per_epoch;
  const int J = sim.stages();
  const int64_t classes = sim.plan.back().out_shape.back();  // [classes] or [T, 256]
  const double base = training::BaseLearningRate(spec.optimizer, spec.batch_size);
  std::vector<std::shared_ptr<models::Model>> F(J);
  std::vector<models::AuxHead> head(J, models::AuxHead{nullptr});
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opt(J), head_opt(J);
  for (int j = 0; j < J; ++j) {
    F[j] = sim.StageModel(spec, j);
    opt[j] = training::MakeOptimizer(spec.optimizer, *F[j]);
    if (j < J - 1) {
      const auto& last = F[j]->blocks().back()->info();
      head[j] =
          *models::MakeAuxHead(*ParseAuxHeadSpec(spec.algorithm.get_if<NwiseOptions>()->aux_head),
                               last.out_shape, classes, models::AuxHeadSeed(spec.seed, last.index));
      head[j]->train();
      head_opt[j] = training::MakeOptimizer(spec.optimizer, *head[j]);
    }
  }
  auto loss_of = [&](int m, const torch::Tensor& h, const torch::Tensor& y) {
    return models::CrossEntropy(m == J - 1 ? h : head[m]->forward(h), y);
  };
  for (int64_t t = 0; t < spec.steps; ++t) {
    data::Batch b = sim.Batch(t);
    std::vector<torch::Tensor> in(J);
    {
      torch::NoGradGuard g;  // the one forward that moves running statistics
      torch::Tensor h = b.x;
      for (int j = 0; j < J; ++j) {
        in[j] = h;
        h = F[j]->forward(h);
      }
    }
    // dL_m / d theta_j through stages j..m, recomputed with frozen statistics.
    auto grad_of = [&](int j, int m) {
      models::FreezeRunningStats freeze;
      torch::Tensor h = in[j].detach();
      for (int s = j; s <= m; ++s) h = F[s]->forward(h);
      auto params = F[j]->parameters();
      return torch::autograd::grad({loss_of(m, h, b.y)}, params, {}, false, false, true);
    };
    for (int j = 0; j < J; ++j) {
      const int own = static_cast<int>(std::min<int64_t>(j + n - 1, J - 1));
      std::vector<torch::Tensor> g = grad_of(j, own);
      if (mix_local && own != j) {
        std::vector<torch::Tensor> local = grad_of(j, j);
        for (size_t i = 0; i < g.size(); ++i) g[i] = 0.5 * g[i] + 0.5 * local[i];
      }
      opt[j]->zero_grad();
      auto params = F[j]->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i].detach();
      training::SetLearningRate(
          *opt[j], training::LearningRateAt(spec.schedule, base, t, per_epoch, spec.steps));
      opt[j]->step();
    }
    // Aux heads on the stage outputs (values of this step's forward).
    for (int m = 0; m + 1 < J; ++m) {
      torch::Tensor out = m + 1 < J ? in[m + 1].detach() : torch::Tensor();
      head_opt[m]->zero_grad();
      loss_of(m, out, b.y).backward();
      training::SetLearningRate(
          *head_opt[m], training::LearningRateAt(spec.schedule, base, t, per_epoch, spec.steps));
      head_opt[m]->step();
    }
  }
  std::map<std::string, torch::Tensor> out;
  for (int j = 0; j < J; ++j) {
    for (auto& [name, v] : Tensors(*F[j])) out[name] = v;
  }
  return out;
}

TEST(NwiseOracle, NEqualsJIsBackprop) {
  const std::string yaml = JobYaml(3, "{name: nwise, n: 3}", 6);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto trainer = CreateReference(*spec);
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Run().ok());
  Outcome got = RunJob(yaml, 3);
  ExpectClose(got.tensors, Tensors((*trainer)->model()));
  // No aux heads are built when no loss but the model's trains anything.
  for (int j = 0; j < 3; ++j) {
    EXPECT_FALSE(got.status.summary().count(absl::StrCat("stage", j, ".aux_head_parameters")));
  }
}

// The same on the byte-level GPT (docs/text.md): the per-module language-model
// heads exist only for n < J, so n = J is end-to-end backprop.
TEST(NwiseOracle, NEqualsJIsBackpropOnTheGpt) {
  const std::string yaml = GptJobYaml(3, "{name: nwise, n: 3, aux_head: linear}", 0.05, 6);
  ExpectClose(RunJob(yaml, 3).tensors, ReferenceTensors(yaml));
}

// 2-wise on the GPT: the paper's auxiliary networks for language modelling
// are per-module language-model heads (a LayerNorm and a projection to the
// 256 byte values at every position).
TEST(NwiseOracle, TwoWiseOnTheGptEqualsTheReferenceOfTheRule) {
  const std::string yaml = GptJobYaml(4, "{name: nwise, n: 2, aux_head: linear}", 0.05, 6);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  Outcome got = RunJob(yaml, 4);
  ExpectClose(got.tensors, Reference(*spec, 2, false));
  EXPECT_GT(got.status.summary().at("stage1.aux_head_parameters"), 0);
}

TEST(NwiseOracle, NEqualsJWithMicroBatchesIsBackpropWithMicroBatches) {
  Outcome nwise = RunJob(JobYaml(3, "{name: nwise, n: 3, micro_batches: 2}", 6), 3);
  Outcome backprop = RunJob(JobYaml(3, "{name: backprop, micro_batches: 2}", 6), 3);
  ExpectClose(nwise.tensors, backprop.tensors);
}

TEST(NwiseOracle, NEqualsOneIsLocalLearningWithoutBackwardTraffic) {
  const std::string yaml = JobYaml(4, "{name: nwise, n: 1, aux_head: 'conv:8,8'}", 8);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  Outcome got = RunJob(yaml, 4);
  ExpectClose(got.tensors, Reference(*spec, 1, false));
  const auto& s = got.status.summary();
  for (int j = 0; j < 4; ++j) {
    const std::string stage = absl::StrCat("stage", j, ".");
    // Every byte a stage sends is forward traffic; nothing goes backward.
    EXPECT_FALSE(s.count(stage + "backward_bytes_sent")) << stage;
    EXPECT_EQ(s.at(stage + "bytes_sent"), j < 3 ? s.at(stage + "forward_bytes_sent") : 0.0)
        << stage;
    if (j < 3) {
      EXPECT_GT(s.at(stage + "aux_head_parameters"), 0) << stage;
    }
  }
  EXPECT_EQ(s.at("stage0.bytes_received"), 0.0);
}

TEST(NwiseOracle, TwoWiseOverFourStagesEqualsTheReferenceOfTheRule) {
  const std::string yaml = JobYaml(4, "{name: nwise, n: 2, aux_head: 'conv:8,8'}", 8);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  Outcome got = RunJob(yaml, 4);
  auto want = Reference(*spec, 2, false);
  ExpectClose(got.tensors, want);
  // The rule is not backprop and not local learning: the oracle tells them apart.
  auto local = Reference(*spec, 1, false);
  double diff = 0;
  for (const auto& [name, w] : want) {
    diff = std::max(diff, (local.at(name) - w).abs().max().item<double>());
  }
  EXPECT_GT(diff, 1e-4);
  // Each gradient crosses exactly one boundary: stage 0 sends nothing back,
  // the others send one gradient per mini-batch.
  const auto& s = got.status.summary();
  EXPECT_FALSE(s.count("stage0.backward_bytes_sent"));
  for (int j = 1; j < 4; ++j) EXPECT_GT(s.at(absl::StrCat("stage", j, ".backward_bytes_sent")), 0);
  EXPECT_FALSE(s.count("stage0.aux_head_parameters"));  // L_0 would train nothing
}

TEST(NwiseOracle, MixLocalEqualsTheReferenceOfTheRule) {
  const std::string yaml =
      JobYaml(3, "{name: nwise, n: 2, mix_local: true, aux_head: 'conv:8,8'}", 8);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectClose(RunJob(yaml, 3).tensors, Reference(*spec, 2, true));
}

// FINE-TUNING through phases: 1-wise for S1 steps, then backprop with a new
// learning rate, a reset optimizer and its own schedule for S2 steps, driven
// by the coordinator on the same workers. Equals local learning followed by a
// fresh single-process backprop run on the next mini-batches; the aux heads
// are gone after the switch.
TEST(NwisePhases, LocalThenBackpropEqualsTheTwoReferencesInSequence) {
  const int64_t S1 = 4, S2 = 4;
  const std::string base = absl::StrCat(R"(name: nwise-finetune
seed: 11
model: {name: resnet, depth: 8, width: 4}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
stages: 3
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
eval: {every_epochs: 0, at_end: false}
)");
  const std::string yaml =
      base + absl::StrCat(
                 R"(phases:
  - {name: local, steps: )",
                 S1, R"(, algorithm: {name: nwise, n: 1, aux_head: 'conv:8,8'}}
  - {name: finetune, steps: )",
                 S2, R"(, algorithm: backprop, optimizer: {lr: 0.01}, schedule: {warmup_epochs: 0}}
)");
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->phases.size(), 2u);
  EXPECT_EQ(spec->steps, S1 + S2);

  // Reference: phase 1 is local learning, phase 2 a fresh backprop trainer.
  auto local = ParseJobSpec(base + absl::StrCat("steps: ", S1,
                                                "\nalgorithm: {name: nwise, n: 1, "
                                                "aux_head: 'conv:8,8'}\n"));
  ASSERT_TRUE(local.ok()) << local.status();
  auto after_local = Reference(*local, 1, false);
  auto finetune = ParseJobSpec(base + absl::StrCat("steps: ", S2, "\nalgorithm: backprop\n"));
  ASSERT_TRUE(finetune.ok());
  finetune->optimizer.lr = 0.01;
  finetune->schedule.warmup_epochs = 0;
  auto trainer = CreateReference(*finetune);
  ASSERT_TRUE(trainer.ok());
  auto& ref = **trainer;
  {
    torch::NoGradGuard g;
    for (const auto& item : ref.model().named_parameters())
      item.value().copy_(after_local.at(item.key()));
    for (const auto& item : ref.model().named_buffers())
      item.value().copy_(after_local.at(item.key()));
  }
  const int64_t per_epoch = ref.train_sampler().batches_per_epoch();
  const double lr = training::BaseLearningRate(finetune->optimizer, finetune->batch_size);
  for (int64_t t = 0; t < S2; ++t) {
    const int64_t g = S1 + t;  // the data continues where phase 1 stopped
    ref.Step(ref.train_sampler().Get(g / per_epoch, g % per_epoch),
             training::LearningRateAt(finetune->schedule, lr, t, per_epoch, S2));
  }

  const Outcome outcome = RunJob(yaml, 3);
  ASSERT_EQ(outcome.status.state(), v1::SUCCEEDED) << outcome.status.reason();
  const v1::JobStatus* st = &outcome.status;
  EXPECT_EQ(st->num_phases(), 2);
  EXPECT_EQ(st->phase(), 1);
  EXPECT_EQ(st->phase_name(), "finetune");
  EXPECT_EQ(st->step(), S1 + S2);
  ExpectClose(outcome.tensors, Tensors(ref.model()));
}

}  // namespace
}  // namespace stagewise::testing
