// Oracles for `auxnet` (docs/algorithms.md#auxnet; AuxNet paper, Sun et al.,
// Algorithm 1):
//   - K = 1 equals backprop;
//   - with a large penalty the constraint violation ||lambda_k - X_{k-1}||
//     falls over the steps at every boundary;
//   - evaluation and the reported training loss come from the true serial
//     forward. (The lambda correction against autograd is a unit test.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise {
namespace {

std::string JobYaml(int stages, const std::string& algorithm, int64_t steps) {
  return absl::StrCat(R"(name: auxnet-oracle
seed: 13
model: {name: resnet, depth: 8, width: 4}
data: {dataset: synthetic, train_size: 256, test_size: 64, shape: [3, 8, 8], classes: 4}
algorithm: )",
                      algorithm, "\nstages: ", stages, R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: )",
                      steps, "\neval: {every_epochs: 0, at_end: true}\n");
}

TEST(AuxNetOracle, OneStageEqualsBackprop) {
  const std::string yaml = JobYaml(1, "{name: auxnet}", 6);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto trainer = testing::CreateReference(*spec);
  ASSERT_TRUE(trainer.ok());
  auto run = (*trainer)->Run();
  ASSERT_TRUE(run.ok());

  const testing::Outcome outcome = testing::RunJob(yaml, 1);
  ASSERT_EQ(outcome.status.state(), v1::SUCCEEDED) << outcome.status.reason();
  const v1::JobStatus* st = &outcome.status;
  const std::map<std::string, torch::Tensor>& got = outcome.tensors;
  int compared = 0;
  for (const auto& item : (*trainer)->model().named_parameters()) {
    const torch::Tensor w = item.value().cpu();
    const double err = ((got.at(item.key()) - w).norm() / w.norm().clamp_min(1e-12)).item<double>();
    EXPECT_LE(err, 1e-5) << item.key();
    ++compared;
  }
  for (const auto& item : (*trainer)->model().named_buffers()) {
    const torch::Tensor w = item.value().to(torch::kCPU, torch::kDouble);
    const double err =
        ((got.at(item.key()).to(torch::kDouble) - w).norm() / w.norm().clamp_min(1e-12))
            .item<double>();
    EXPECT_LE(err, 1e-5) << item.key();
  }
  EXPECT_GT(compared, 0);
  // The evaluation is the real model's: the same accuracy as the reference.
  EXPECT_NEAR(st->eval_accuracy(), run->test.accuracy, 1e-9);
}

// A large beta pulls each stage's output onto the next stage's auxiliary
// variable, and a large eta pulls the corrected lambda (the AuxNet's
// distillation target) onto the output below: the violation falls several-fold
// within 60 steps. (So large a penalty leaves the classifier untrained; the
// example uses beta = 1.)
TEST(AuxNetOracle, LargePenaltyDrivesTheConstraintViolationDown) {
  const std::string yaml =
      JobYaml(3, "{name: auxnet, beta: 100, aux_lr: 20, serial_loss_every: 5}", 60);
  testing::Cluster cluster({.workers = 3});
  ASSERT_TRUE(cluster.WaitForWorkers(3));
  auto id = cluster.manager().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  const auto& s = st->summary();
  for (int k = 1; k < 3; ++k) {
    const std::string stage = absl::StrCat("stage", k, ".");
    ASSERT_TRUE(s.count(stage + "constraint_violation_start")) << stage;
    const double start = s.at(stage + "constraint_violation_start");
    const double end = s.at(stage + "constraint_violation_end");
    EXPECT_GT(start, 0) << stage;
    EXPECT_LT(end, 0.25 * start) << stage << " start " << start << " end " << end;
    EXPECT_GT(s.at(stage + "auxnet_parameters"), 0) << stage;
  }
  EXPECT_FALSE(s.count("stage0.constraint_violation_start"));  // lambda_0 is the data
  EXPECT_TRUE(s.count("stage0.penalty_loss"));
  EXPECT_TRUE(s.count("stage2.serial_train_loss"));
  EXPECT_GT(st->train_loss(), 0);
  for (const char* key : {"stage0.data_seconds", "stage1.aux_forward_seconds",
                          "stage1.aux_backward_seconds", "stage2.forward_seconds"}) {
    EXPECT_TRUE(s.count(key)) << key;
  }
}

}  // namespace
}  // namespace stagewise
