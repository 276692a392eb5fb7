// Replacing one stage (recovery.replay, docs/fault_tolerance.md): on real
// processes, a job of four stages, one replica, checkpoints every 50 steps,
// has ten random workers SIGKILLed one after the other, each time with an
// idle worker to take its stage (the killed one starts again and is the next
// spare). Every loss is repaired inside the one attempt:
// - the surviving stages redo nothing (one attempt, no step redone, and
//   recovery.max_restarts: 0, so any rollback would fail the job);
// - the replaced stage redoes at most the steps since its last checkpoint;
// - the parameters and BatchNorm buffers at the end equal those of the same
//   job run without a fault (<= 1e-6 relative);
// - the time from each kill to full speed, and the replay's share of it,
//   are printed.
//
// The kill steps and workers are random; the seed is printed and can be
// fixed with STAGEWISE_TEST_SEED=<n>.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/process.h"
#include "tests/oracle/oracle_util.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

using testing::ProcessCluster;
using testing::TestSeed;

constexpr int kStages = 4;
constexpr int64_t kEvery = 50;  // checkpoint.every_steps
constexpr int64_t kSteps = 640;

std::string JobYaml(const std::string& checkpoint_dir, const std::string& algorithm) {
  return absl::StrCat(R"(name: replay-chaos
seed: 5
model: {name: revnet, depth: 18, width: 8, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [3, 16, 16], classes: 4}
stages: )",
                      kStages, R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: )",
                      kSteps, R"(
eval: {every_epochs: 4, at_end: true}
checkpoint: {dir: )",
                      checkpoint_dir, ", every_steps: ", kEvery, R"(, keep: 2}
recovery: {max_restarts: 0, wait_seconds: 60, replay: true}
algorithm: )",
                      algorithm, "\n");
}

// `kills` kills of the job running `algorithm`, one after the other.
void RunReplayChaos(const std::string& algorithm, int kills) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  ProcessCluster cluster(kStages + 1);  // one spare
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  const std::string yaml = JobYaml(ckpt, algorithm);

  // The run without a fault.
  auto clean_id = cluster.client().Submit(yaml);
  ASSERT_TRUE(clean_id.ok()) << clean_id.status();
  auto clean = cluster.WaitForEnd(*clean_id);
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_EQ(clean->state(), v1::SUCCEEDED) << clean->reason();
  auto want = testing::CheckpointTensors(ckpt, *clean_id, kSteps);
  ASSERT_TRUE(want.ok()) << want.status();

  // The same job, ten kills: each at a random step of its own stretch of
  // the run, of a random worker holding a stage.
  auto id = cluster.client().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  const int64_t stretch = (kSteps - 2 * kEvery) / kills;
  std::map<std::string, int> index;  // worker id -> process index
  for (int i = 0; i < cluster.num_workers(); ++i) index[absl::StrCat("w", i)] = i;
  std::vector<std::string> lines;
  for (int k = 0; k < kills; ++k) {
    const int64_t at =
        kEvery / 2 + k * stretch + std::uniform_int_distribution<int64_t>(0, stretch / 2)(rng);
    auto reached = cluster.WaitFor(
        *id, [&](const v1::JobStatus& st) { return st.state() == v1::RUNNING && st.step() >= at; });
    ASSERT_TRUE(reached.ok()) << reached.status();
    ASSERT_EQ(reached->state(), v1::RUNNING) << "kill " << k << ": " << reached->reason();
    ASSERT_EQ(reached->attempts_size(), 1) << reached->DebugString();
    const v1::JobAttempt& attempt = reached->attempts(0);
    const int stage = std::uniform_int_distribution<int>(0, kStages - 1)(rng);
    const std::string victim = attempt.workers(stage);
    ASSERT_EQ(index.count(victim), 1u) << victim;
    ASSERT_TRUE(cluster.KillAndRestartWorker(index[victim]).ok());
    // One at a time: the next kill once this stage is back at full speed.
    auto repaired = cluster.WaitFor(*id, [&](const v1::JobStatus& st) {
      return st.state() != v1::RUNNING ||
             (st.attempts_size() == 1 && st.attempts(0).replacements_size() == k + 1 &&
              st.attempts(0).replacements(k).full_speed_seconds() > 0);
    });
    ASSERT_TRUE(repaired.ok()) << repaired.status();
    ASSERT_EQ(repaired->state(), v1::RUNNING) << "kill " << k << " (worker " << victim << ", stage "
                                              << stage << "): " << repaired->reason() << "\n"
                                              << cli::TailFile(cluster.CoordinatorLog(), 60);
    const v1::StageReplacement& r = repaired->attempts(0).replacements(k);
    EXPECT_EQ(r.stage(), stage);
    EXPECT_EQ(r.lost_worker(), victim);
    lines.push_back(absl::StrFormat(
        "kill %d: stage %d (worker %s) at job step %d; replaced on %s from the checkpoint at "
        "step %d, replayed to step %d (%d steps, %.2f MB) in %.2f s; full speed after %.2f s",
        k, stage, victim, r.job_step(), r.worker(), r.from_step(), r.replayed_to_step(),
        r.steps_redone(), static_cast<double>(r.bytes()) / 1e6, r.replay_seconds(),
        r.full_speed_seconds()));
  }
  auto done = cluster.WaitForEnd(*id);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n"
                                          << cli::TailFile(cluster.CoordinatorLog(), 60);
  for (const std::string& line : lines) {
    std::cout << "[replay] " << algorithm.substr(0, algorithm.find(",")) << ": " << line << "\n";
  }
  // Nothing rolled back: one attempt, no step redone by the job.
  EXPECT_EQ(done->attempts_size(), 1);
  EXPECT_EQ(done->steps_redone(), 0);
  EXPECT_EQ(done->step(), kSteps);
  ASSERT_EQ(done->attempts(0).replacements_size(), kills);
  double worst = 0;
  for (const v1::StageReplacement& r : done->attempts(0).replacements()) {
    // The replaced stage: at most the steps since its last checkpoint (the
    // stage may have been a step ahead of the job's reported step).
    EXPECT_EQ(r.from_step() % kEvery, 0) << r.DebugString();
    EXPECT_GT(r.replayed_to_step(), 0) << r.DebugString();
    EXPECT_LE(r.steps_redone(), kEvery + 2) << r.DebugString();
    EXPECT_GT(r.full_speed_seconds(), 0) << r.DebugString();
    worst = std::max(worst, r.full_speed_seconds() - r.replay_seconds());
  }
  std::cout << "[replay] the worst kill-to-full-speed time less its replay: " << worst << " s\n";
  auto got = testing::CheckpointTensors(ckpt, *id, kSteps);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, *want, 1e-6);
}

TEST(ReplayChaosTest, TenKillsOfABackpropJobCostTheOtherStagesNoStep) {
  RunReplayChaos("{name: backprop, micro_batches: 4, schedule: 1f1b}", 10);
}

// The decoupled algorithms' in-flight state is in their shards and in the
// kept messages: PETRA replays the same way.
TEST(ReplayChaosTest, KillsOfAPetraJobCostTheOtherStagesNoStep) {
  RunReplayChaos("{name: petra}", 4);
}

}  // namespace
}  // namespace stagewise
