// Recovery oracles (docs/fault_tolerance.md): a job whose worker process is
// SIGKILLed at a random step (and started again by the test) ends with the
// same parameters and BatchNorm buffers (<= 1e-6 relative) and the same step
// count as the same job run without the fault, with the same checkpoint
// schedule. Real processes: a stagewise-coordinator and stagewise-workers.
//
// The kill step and stage are random; the seed is printed and can be fixed
// with STAGEWISE_TEST_SEED=<n>.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "tests/oracle/oracle_util.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

using testing::ProcessCluster;
using testing::TestSeed;

struct Case {
  std::string algorithm;  // the YAML after "algorithm: " (or a phases: block)
  int stages = 2;
  int64_t steps = 160;
  std::string model = "{name: revnet, depth: 18, width: 8, blocks: [1, 1, 1, 1]}";
  bool phases = false;  // `algorithm` holds a whole phases: list
};

std::string JobYaml(const Case& c, const std::string& checkpoint_dir, int64_t every) {
  std::string yaml = absl::StrCat(R"(name: recovery-oracle
seed: 5
model: )",
                                  c.model, R"(
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [3, 16, 16], classes: 4}
stages: )",
                                  c.stages, R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
eval: {every_epochs: 1, at_end: true}
checkpoint: {dir: )",
                                  checkpoint_dir, ", every_steps: ", every, R"(, keep: 2}
recovery: {max_restarts: 3, wait_seconds: 120}
)");
  if (c.phases) return absl::StrCat(yaml, c.algorithm, "\n");
  return absl::StrCat(yaml, "algorithm: ", c.algorithm, "\nsteps: ", c.steps, "\n");
}

void RunRecoveryOracle(const Case& c) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  ProcessCluster cluster(c.stages);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  const int64_t every = 20;
  const std::string yaml = JobYaml(c, ckpt, every);

  // The run without a fault.
  auto clean_id = cluster.client().Submit(yaml);
  ASSERT_TRUE(clean_id.ok()) << clean_id.status();
  auto clean = cluster.WaitForEnd(*clean_id);
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_EQ(clean->state(), v1::SUCCEEDED) << clean->reason();
  EXPECT_EQ(clean->attempts_size(), 1);
  const int64_t total = clean->total_steps();
  EXPECT_EQ(clean->step(), total);
  auto want = testing::CheckpointTensors(ckpt, *clean_id, total);
  ASSERT_TRUE(want.ok()) << want.status();

  // The same job; one worker is killed at a random step past the first
  // checkpoint and started again.
  const int64_t kill_step = std::uniform_int_distribution<int64_t>(every + 1, total * 6 / 10)(rng);
  const int victim = std::uniform_int_distribution<int>(0, c.stages - 1)(rng);
  SCOPED_TRACE(absl::StrCat("kill worker ", victim, " at step >= ", kill_step));
  auto id = cluster.client().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  auto reached = cluster.WaitFor(*id, [&](const v1::JobStatus& st) {
    return st.state() == v1::RUNNING && st.step() >= kill_step;
  });
  ASSERT_TRUE(reached.ok()) << reached.status();
  ASSERT_EQ(reached->state(), v1::RUNNING)
      << "the job ended before the kill: " << reached->DebugString();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster.KillAndRestartWorker(victim).ok());
  auto resumed = cluster.WaitFor(*id, [](const v1::JobStatus& st) {
    return st.state() == v1::RUNNING && st.attempts_size() >= 2;
  });
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const double recovery_s = absl::ToDoubleSeconds(absl::Now() - killed);
  auto done = cluster.WaitForEnd(*id);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n"
                                          << cli::TailFile(cluster.CoordinatorLog(), 40);
  EXPECT_EQ(done->step(), total);
  EXPECT_EQ(done->total_steps(), total);
  ASSERT_GE(done->attempts_size(), 2) << done->DebugString();
  const v1::JobAttempt& second = done->attempts(1);
  EXPECT_GT(second.from_step(), 0);
  EXPECT_EQ(second.from_step() % every, 0);
  EXPECT_FALSE(done->attempts(0).end_reason().empty());
  std::cout << "[recovery] " << c.algorithm.substr(0, 40) << ": killed worker " << victim
            << " at step " << reached->step() << ", resumed from step " << second.from_step()
            << ", steps redone " << done->steps_redone() << ", running again after " << recovery_s
            << " s; first attempt ended: " << done->attempts(0).end_reason() << "\n";
  auto got = testing::CheckpointTensors(ckpt, *id, total);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, *want, 1e-6);
}

TEST(RecoveryOracleTest, Backprop) {
  RunRecoveryOracle({.algorithm = "{name: backprop, micro_batches: 2}"});
}

TEST(RecoveryOracleTest, Delayed) {
  RunRecoveryOracle({.algorithm = "{name: delayed, weights: stash}", .stages = 3});
}

TEST(RecoveryOracleTest, Petra) {
  RunRecoveryOracle({.algorithm = "{name: petra, accumulation: 3}", .stages = 3});
}

TEST(RecoveryOracleTest, FeaturesReplay) {
  RunRecoveryOracle({.algorithm = "features_replay", .stages = 3});
}

TEST(RecoveryOracleTest, Nwise) {
  RunRecoveryOracle({.algorithm = "{name: nwise, n: 2, aux_head: 'conv:8,8'}", .stages = 3});
}

// Two phases (local learning, then backprop with a reset optimizer); the
// fault may land in either.
TEST(RecoveryOracleTest, TwoPhases) {
  RunRecoveryOracle({.algorithm = R"(phases:
  - {name: local, steps: 70, algorithm: {name: nwise, n: 1, aux_head: 'conv:8,8'}}
  - {name: finetune, steps: 90, algorithm: backprop, optimizer: {lr: 0.01}, schedule: {warmup_epochs: 0}})",
                     .stages = 2,
                     .phases = true});
}

}  // namespace
}  // namespace stagewise
