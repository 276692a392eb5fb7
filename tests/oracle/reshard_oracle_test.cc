// Resharding oracles (docs/fault_tolerance.md, "Fewer stages"): a job of
// four stages with recovery.min_stages loses workers and gets no spare; after
// recovery.wait_seconds it resumes from its checkpoint on the stages it has
// workers for, the checkpoint regrouped onto the new cut, and finishes.
// - backprop: the parameters and BatchNorm buffers at the end equal those of
//   the same job run on four stages without a fault (<= 1e-6 relative),
//   resumed on three stages and on two;
// - the decoupled algorithms: SUCCEEDED with every step taken once, the
//   resume on the smaller cut as documented (each restarts its in-flight
//   state at the resume step).
// Real processes: a stagewise-coordinator and stagewise-workers.
//
// The kill step and the workers lost are random; the seed is printed and can
// be fixed with STAGEWISE_TEST_SEED=<n>.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "tests/oracle/oracle_util.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

using testing::ProcessCluster;
using testing::TestSeed;

constexpr int kStages = 4;
constexpr int64_t kEvery = 20;  // checkpoint.every_steps

std::string JobYaml(const std::string& algorithm, const std::string& checkpoint_dir,
                    int min_stages) {
  return absl::StrCat(R"(name: reshard-oracle
seed: 5
model: {name: revnet, depth: 18, width: 8, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [3, 16, 16], classes: 4}
stages: )",
                      kStages, R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: 160
eval: {every_epochs: 1, at_end: true}
checkpoint: {dir: )",
                      checkpoint_dir, ", every_steps: ", kEvery, R"(, keep: 2}
recovery: {max_restarts: 3, wait_seconds: 3, min_stages: )",
                      min_stages, R"(}
algorithm: )",
                      algorithm, "\n");
}

// Runs `yaml` on a fresh cluster of four workers, kills `lost` of them (no
// spare) at a random step past the first checkpoint and waits for the end:
// the job must resume on 4 - lost stages and succeed. Returns the job id.
std::string RunLosing(ProcessCluster& cluster, const std::string& yaml, int lost,
                      std::mt19937_64& rng) {
  auto id = cluster.client().Submit(yaml);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return "";
  const int64_t kill_step = std::uniform_int_distribution<int64_t>(kEvery + 1, 90)(rng);
  std::vector<int> victims(kStages);
  std::iota(victims.begin(), victims.end(), 0);
  std::shuffle(victims.begin(), victims.end(), rng);
  victims.resize(static_cast<size_t>(lost));
  SCOPED_TRACE(absl::StrCat("kill ", lost, " worker(s) at step >= ", kill_step));
  auto reached = cluster.WaitFor(*id, [&](const v1::JobStatus& st) {
    return st.state() == v1::RUNNING && st.step() >= kill_step;
  });
  EXPECT_TRUE(reached.ok()) << reached.status();
  if (!reached.ok()) return "";
  EXPECT_EQ(reached->state(), v1::RUNNING) << "ended before the kill: " << reached->reason();
  for (int v : victims) EXPECT_TRUE(cluster.KillWorker(v).ok());
  auto done = cluster.WaitForEnd(*id, absl::Seconds(300));
  EXPECT_TRUE(done.ok()) << done.status();
  if (!done.ok()) return "";
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n"
                                          << cli::TailFile(cluster.CoordinatorLog(), 40);
  EXPECT_EQ(done->step(), done->total_steps());
  EXPECT_EQ(done->num_stages(), kStages - lost) << done->DebugString();
  EXPECT_GE(done->attempts_size(), 2) << done->DebugString();
  if (done->attempts_size() >= 2) {
    const v1::JobAttempt& last = done->attempts(done->attempts_size() - 1);
    EXPECT_EQ(last.workers_size(), kStages - lost);
    EXPECT_GT(last.from_step(), 0);
    EXPECT_EQ(last.from_step() % kEvery, 0);
    std::cout << "[reshard] killed " << lost << " worker(s) at step " << reached->step()
              << ", resumed on " << done->num_stages() << " stages from step " << last.from_step()
              << "; " << done->steps_redone() << " steps redone\n";
  }
  return *id;
}

void RunBackpropOracle(int lost) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  ProcessCluster cluster(kStages);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  const std::string yaml = JobYaml("{name: backprop, micro_batches: 2}", ckpt, kStages - lost);
  auto clean_id = cluster.client().Submit(yaml);
  ASSERT_TRUE(clean_id.ok()) << clean_id.status();
  auto clean = cluster.WaitForEnd(*clean_id);
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_EQ(clean->state(), v1::SUCCEEDED) << clean->reason();
  const int64_t total = clean->total_steps();
  auto want = testing::CheckpointTensors(ckpt, *clean_id, total);
  ASSERT_TRUE(want.ok()) << want.status();

  const std::string id = RunLosing(cluster, yaml, lost, rng);
  ASSERT_FALSE(id.empty());
  auto got = testing::CheckpointTensors(ckpt, id, total);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, *want, 1e-6);
}

TEST(ReshardOracleTest, BackpropFromFourStagesOntoThree) { RunBackpropOracle(1); }

TEST(ReshardOracleTest, BackpropFromFourStagesOntoTwo) { RunBackpropOracle(2); }

// The decoupled algorithms restart their in-flight state at the resume step
// on the new cut (StageContext::resharded): they finish, every step once.
TEST(ReshardOracleTest, DecoupledAlgorithmsFinishOnTwoStages) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  for (const std::string algorithm :
       {"{name: delayed, weights: stash}", "{name: petra, accumulation: 3}", "features_replay",
        "{name: nwise, n: 2, aux_head: 'conv:8,8'}", "{name: auxnet, beta: 100, aux_lr: 0.1}"}) {
    SCOPED_TRACE(algorithm);
    ProcessCluster cluster(kStages);
    ASSERT_TRUE(cluster.ok()) << cluster.error();
    EXPECT_FALSE(
        RunLosing(cluster, JobYaml(algorithm, cluster.dir() + "/checkpoints", 2), 2, rng).empty());
  }
}

}  // namespace
}  // namespace stagewise
