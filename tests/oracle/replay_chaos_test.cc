// Replacing one stage (recovery.replay, docs/fault_tolerance.md): on real
// processes, a job of four stages, one replica (and one of two stages, two
// replicas, where a lost replica copies a survivor), checkpoints every 50 steps,
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

// The job's shape: its stages, replicas and model.
struct Shape {
  int stages = kStages;
  int replicas = 1;
  std::string model = "{name: revnet, depth: 18, width: 8, blocks: [1, 1, 1, 1]}";
};

std::string JobYaml(const std::string& checkpoint_dir, const std::string& algorithm,
                    const Shape& shape) {
  return absl::StrCat(R"(name: replay-chaos
seed: 5
model: )",
                      shape.model, R"(
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [3, 16, 16], classes: 4}
stages: {count: )",
                      shape.stages, ", replicas: ", shape.replicas, R"(}
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
void RunReplayChaos(const std::string& algorithm, int kills, const Shape& shape = {}) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  const int slots = shape.stages * shape.replicas;
  const bool replicated = shape.replicas > 1;
  ProcessCluster cluster(slots + 1);  // one spare
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  const std::string yaml = JobYaml(ckpt, algorithm, shape);

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
    const int slot = std::uniform_int_distribution<int>(0, slots - 1)(rng);
    const int stage = slot % shape.stages, replica = slot / shape.stages;
    const std::string victim = attempt.workers(slot);
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
    EXPECT_EQ(r.replica(), replica);
    EXPECT_EQ(r.lost_worker(), victim);
    const std::string from =
        replicated
            ? absl::StrFormat("copying replica %d (%.2f MB in %.2f s) at step %d",
                              r.copied_from_replica(), static_cast<double>(r.copied_bytes()) / 1e6,
                              r.copy_seconds(), r.from_step())
            : absl::StrFormat("from the checkpoint at step %d", r.from_step());
    lines.push_back(absl::StrFormat(
        "kill %d: stage %d replica %d (worker %s) at job step %d; replaced on %s %s, replayed to "
        "step %d (%d steps, %.2f MB) in %.2f s; full speed after %.2f s",
        k, stage, replica, victim, r.job_step(), r.worker(), from, r.replayed_to_step(),
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
    EXPECT_GT(r.replayed_to_step(), 0) << r.DebugString();
    if (replicated) {
      // A lost replica copies a survivor's state at the step the survivors
      // wait in: it redoes at most that step (the others none).
      EXPECT_NE(r.copied_from_replica(), r.replica()) << r.DebugString();
      EXPECT_GT(r.copied_bytes(), 0) << r.DebugString();
      EXPECT_LE(r.steps_redone(), 1) << r.DebugString();
    } else {
      // The replaced stage: at most the steps since its last checkpoint (the
      // stage may have been a step ahead of the job's reported step).
      EXPECT_EQ(r.from_step() % kEvery, 0) << r.DebugString();
      EXPECT_EQ(r.copied_bytes(), 0) << r.DebugString();
      EXPECT_LE(r.steps_redone(), kEvery + 2) << r.DebugString();
    }
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

// Two stages, two replicas: a lost replica's spare copies the live state of
// the stage's other replica over gRPC, the stage's replica group forms again
// and the survivors average the same step's gradients once more; no other
// worker redoes a step. An MLP: BatchNorm statistics are each replica's own,
// and a copied replica takes its source's (docs/fault_tolerance.md).
TEST(ReplayChaosTest, KillsOfReplicasCostTheOthersNoStep) {
  RunReplayChaos("{name: backprop, micro_batches: 2, schedule: 1f1b}", 10,
                 {.stages = 2, .replicas = 2, .model = "{name: mlp, hidden: [512, 512, 256]}"});
}

}  // namespace
}  // namespace stagewise
