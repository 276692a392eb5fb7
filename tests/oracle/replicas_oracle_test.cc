// Replicated stages (stages.replicas, docs/replicas.md): J x R in-process
// workers, each stage's replicas averaging their gradients over real gloo
// (rendezvous through the coordinator's CollectiveStore), against J workers
// on the same global batch. A replica's share of a mini-batch is what one
// micro-batch of the J x 1 run with M = R computes, so the two runs take the
// same steps: BatchNorm's batch statistics come from B / R samples in both.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/training/reference_trainer.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise {
namespace {

std::string Yaml(const std::string& model_and_data, const std::string& algorithm, int stages,
                 int replicas, int batch, int steps) {
  return absl::StrCat("name: replicas\nseed: 3\n", model_and_data, "algorithm: ", algorithm,
                      "\nstages: {count: ", stages, ", replicas: ", replicas,
                      "}\noptimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}\n"
                      "batch_size: ",
                      batch, "\nsteps: ", steps, "\neval: {every_epochs: 0, at_end: true}\n");
}

constexpr char kRevNet[] = R"(model: {name: revnet, depth: 18, width: 4, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
)";
constexpr char kGpt[] = R"(model: {name: gpt, depth: 2, width: 16, heads: 2}
data: {dataset: fortunes, sequence_length: 16, train_size: 64, limit_test: 4}
)";
// Reversible Transformer blocks (PETRA rebuilds their inputs); every
// mini-batch draws its own sequence length, alike on every replica.
constexpr char kReformer[] = R"(model: {name: reformer, depth: 4, width: 16, heads: 2}
data: {dataset: fortunes, sequence_length: 16, min_sequence_length: 5, train_size: 64, limit_test: 4}
)";

// Parameters only: running statistics are each replica's own (replica 0's are
// checkpointed), while the J x 1 run updates them once per micro-batch. Every
// replica of a stage holds the same parameters; the map keeps one per name.
std::map<std::string, torch::Tensor> Parameters(const std::string& yaml, int workers) {
  testing::Outcome out = testing::RunJob(yaml, workers, /*buffers=*/false);
  EXPECT_EQ(out.status.num_replicas(), workers > 2 ? 2 : 1);
  return out.tensors;
}

TEST(ReplicasOracle, BackpropTwoStagesTwoReplicasEqualsTwoStagesWithTwoMicroBatches) {
  const auto want = Parameters(Yaml(kRevNet, "{name: backprop, micro_batches: 2}", 2, 1, 16, 6), 2);
  const auto got = Parameters(Yaml(kRevNet, "{name: backprop}", 2, 2, 16, 6), 4);
  testing::ExpectClose(got, want);
}

// 1F1B with micro-batches: the last micro-batch's backward starts the
// all-reduce of every bucket whose gradients are final (sync.overlap:
// true); with 1 KiB buckets most start before the backward ends. With
// overlap, and averaging after the backward instead, 2 x 2 equals 2 x 1.
TEST(ReplicasOracle, OverlappedAllReduceEqualsAveragingAfterTheBackward) {
  const std::string one_f_one_b = "{name: backprop, micro_batches: 2, schedule: 1f1b}";
  const auto want = Parameters(Yaml(kGpt, one_f_one_b, 2, 1, 8, 5), 2);
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap);
    const std::string yaml =
        Yaml(kGpt, one_f_one_b, 2, 2, 8, 5) +
        absl::StrCat("sync: {overlap: ", overlap ? "true" : "false", ", bucket_mb: 0.001}\n");
    testing::Outcome out = testing::RunJob(yaml, 4, /*buffers=*/false);
    EXPECT_EQ(out.status.num_replicas(), 2);
    testing::ExpectClose(out.tensors, want);
    const auto& summary = out.status.summary();
    for (const char* key : {"stage0.overlapped_buckets", "stage1.overlapped_buckets"}) {
      if (overlap) {
        ASSERT_TRUE(summary.contains(key)) << key;
        EXPECT_GT(summary.at(key), 0) << key;  // buckets started during the backward
      } else {
        EXPECT_FALSE(summary.contains(key)) << key;
      }
    }
  }
}

TEST(ReplicasOracle, GptTwoStagesTwoReplicasEqualsTwoStages) {
  // No BatchNorm: a replica's share is just a slice of the mini-batch's mean.
  const auto want = Parameters(Yaml(kGpt, "{name: backprop}", 2, 1, 8, 5), 2);
  const auto got = Parameters(Yaml(kGpt, "{name: backprop}", 2, 2, 8, 5), 4);
  testing::ExpectClose(got, want);
}

// The decoupled algorithms average the same stale gradients on every replica
// at the same step, so without BatchNorm J x R equals J x 1 on the same batch.
TEST(ReplicasOracle, PetraWithAccumulationOnTwoReplicasEqualsOneReplica) {
  const std::string petra = "{name: petra, accumulation: 2}";
  const auto want = Parameters(Yaml(kReformer, petra, 2, 1, 8, 6), 2);
  const auto got = Parameters(Yaml(kReformer, petra, 2, 2, 8, 6), 4);
  testing::ExpectClose(got, want);
}

TEST(ReplicasOracle, DelayedOnTwoReplicasEqualsOneReplica) {
  const auto want = Parameters(Yaml(kGpt, "{name: delayed}", 2, 1, 8, 6), 2);
  const auto got = Parameters(Yaml(kGpt, "{name: delayed}", 2, 2, 8, 6), 4);
  testing::ExpectClose(got, want);
}

// AuxNet: each stage's step and its auxiliary network's step average their
// gradients among the replicas, and the per-sample lambda correction is
// scaled from the replica's share to the mini-batch, so without BatchNorm (an
// MLP, whose auxiliary networks are linear maps) J x R equals J x 1 on the
// same batch, with either aux_update rule.
constexpr char kMlp[] = R"(model: {name: mlp, hidden: [32, 24, 16]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [1, 6, 6], classes: 4}
)";

TEST(ReplicasOracle, AuxNetOnTwoReplicasEqualsOneReplica) {
  for (const char* update : {"distill", "direct"}) {
    SCOPED_TRACE(update);
    const std::string auxnet = absl::StrCat(
        "{name: auxnet, beta: 10, aux_lr: 0.5, aux_update: ", update, ", serial_loss_every: 2}");
    const auto want = Parameters(Yaml(kMlp, auxnet, 2, 1, 8, 6), 2);
    const auto got = Parameters(Yaml(kMlp, auxnet, 2, 2, 8, 6), 4);
    testing::ExpectClose(got, want);
  }
}

// sync.every = H (the DiLoCo recipe): each replica steps on its own share for
// H steps, then the replicas average their moves since the last
// synchronisation and an outer Nesterov step moves the anchor, which every
// replica continues from. The simulation: R whole-model reference trainers,
// each on its share of the same mini-batches, with that outer step written
// out; against 2 stages x 2 replicas after two synchronisations.
TEST(ReplicasOracle, OuterSyncEveryThreeStepsEqualsItsSimulation) {
  constexpr int R = 2, H = 3, kSteps = 6, kBatch = 8;
  constexpr double kOuterLr = 0.7, kMomentum = 0.9;
  const std::string yaml = Yaml(kGpt, "{name: backprop}", 2, R, kBatch, kSteps) +
                           absl::StrCat("sync: {every: ", H, ", outer: nesterov, lr: ", kOuterLr,
                                        ", momentum: ", kMomentum, "}\n");
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<std::unique_ptr<training::ReferenceTrainer>> replicas;
  for (int r = 0; r < R; ++r) {
    auto t = training::ReferenceTrainer::Create(*spec);
    ASSERT_TRUE(t.ok()) << t.status();
    replicas.push_back(std::move(*t));
  }
  auto params = [](training::ReferenceTrainer& t) {
    std::map<std::string, torch::Tensor> out;
    for (const auto& item : t.model().named_parameters()) out[item.key()] = item.value();
    return out;
  };
  std::map<std::string, torch::Tensor> anchor, momentum;
  for (const auto& [name, p] : params(*replicas[0])) {
    anchor[name] = p.detach().clone();
    momentum[name] = torch::zeros_like(p);
  }
  const int64_t per_epoch = replicas[0]->train_sampler().batches_per_epoch();
  const int64_t share = kBatch / R;
  for (int64_t t = 0; t < kSteps; ++t) {
    const data::Batch b = replicas[0]->train_sampler().Get(t / per_epoch, t % per_epoch);
    for (int r = 0; r < R; ++r) {
      data::Batch mine = b;
      mine.x = b.x.narrow(0, r * share, share);
      mine.y = b.y.narrow(0, r * share, share);
      replicas[r]->Step(mine, spec->optimizer.lr);
    }
    if ((t + 1) % H != 0) continue;
    torch::NoGradGuard no_grad;
    for (auto& [name, a] : anchor) {
      torch::Tensor delta = torch::zeros_like(a);
      for (int r = 0; r < R; ++r) delta += (a - params(*replicas[r]).at(name)) / R;
      momentum[name] = kMomentum * momentum[name] + delta;
      a -= kOuterLr * (delta + kMomentum * momentum[name]);
      for (int r = 0; r < R; ++r) params(*replicas[r]).at(name).copy_(a);
    }
  }
  const auto got = Parameters(yaml, 2 * R);
  testing::ExpectClose(got, anchor);
  // Between synchronisations the replicas drift apart: a sync every step
  // (plain gradient averaging) takes other steps.
  const auto every_step = Parameters(Yaml(kGpt, "{name: backprop}", 2, R, kBatch, kSteps), 2 * R);
  double differs = 0;
  for (const auto& [name, a] : anchor) {
    differs = std::max(differs, (every_step.at(name) - a).abs().max().item<double>());
  }
  EXPECT_GT(differs, 1e-4);
}

}  // namespace
}  // namespace stagewise
