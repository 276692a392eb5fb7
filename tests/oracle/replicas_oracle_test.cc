// Replicated stages (stages.replicas, docs/replicas.md): J x R in-process
// workers, each stage's replicas averaging their gradients over real gloo
// (rendezvous through the coordinator's CollectiveStore), against J workers
// on the same global batch. A replica's share of a mini-batch is what one
// micro-batch of the J x 1 run with M = R computes, so the two runs take the
// same steps: BatchNorm's batch statistics come from B / R samples in both.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace stagewise
