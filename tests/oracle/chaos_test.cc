// Chaos (label `chaos`, bounded by its ctest TIMEOUT): a 3-stage job on real
// processes survives random SIGKILLs of its workers (at least five) and one
// of the coordinator; its history shows every attempt and its final
// parameters and buffers equal those of the same job run without faults.
// The seed is printed; STAGEWISE_TEST_SEED=<n> repeats a run.
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

std::string JobYaml(const std::string& checkpoint_dir) {
  return absl::StrCat(R"(name: chaos
seed: 11
model: {name: revnet, depth: 18, width: 8, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [3, 16, 16], classes: 4}
algorithm: {name: delayed, weights: stash}
stages: 3
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: 320
eval: {every_epochs: 2, at_end: true}
checkpoint: {dir: )",
                      checkpoint_dir, R"(, every_steps: 20, keep: 2}
recovery: {max_restarts: 12, wait_seconds: 120}
)");
}

TEST(ChaosTest, WorkerAndCoordinatorKills) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  ProcessCluster cluster(3);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  const std::string yaml = JobYaml(ckpt);

  auto clean_id = cluster.client().Submit(yaml);
  ASSERT_TRUE(clean_id.ok()) << clean_id.status();
  auto clean = cluster.WaitForEnd(*clean_id);
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_EQ(clean->state(), v1::SUCCEEDED) << clean->reason();
  const int64_t total = clean->total_steps();
  auto want = testing::CheckpointTensors(ckpt, *clean_id, total);
  ASSERT_TRUE(want.ok()) << want.status();

  auto id = cluster.client().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  constexpr int kWorkerKills = 5;
  const int coordinator_at = std::uniform_int_distribution<int>(1, kWorkerKills)(rng);
  int64_t last_checkpoint = -1;
  for (int fault = 0; fault <= kWorkerKills; ++fault) {
    // Each fault waits for a checkpoint newer than the previous fault's, and
    // then a few more steps, so the job keeps moving forward.
    const int64_t extra = std::uniform_int_distribution<int64_t>(1, 15)(rng);
    int64_t checkpoint_seen = -1;
    auto st = cluster.WaitFor(*id, [&](const v1::JobStatus& s) {
      if (s.state() != v1::RUNNING || s.last_checkpoint_step() <= last_checkpoint) return false;
      if (checkpoint_seen < 0) checkpoint_seen = s.last_checkpoint_step();
      return s.step() >= checkpoint_seen + extra;
    });
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->state(), v1::RUNNING)
        << "the job ended before fault " << fault << ": " << st->DebugString();
    last_checkpoint = st->last_checkpoint_step();
    if (fault == coordinator_at) {
      std::cout << "[chaos] fault " << fault << ": kill -9 the coordinator at step " << st->step()
                << std::endl;
      ASSERT_TRUE(cluster.KillAndRestartCoordinator().ok());
      continue;
    }
    const int victim = std::uniform_int_distribution<int>(0, 2)(rng);
    std::cout << "[chaos] fault " << fault << ": kill -9 worker " << victim << " at step "
              << st->step() << std::endl;
    ASSERT_TRUE(cluster.KillAndRestartWorker(victim).ok());
  }
  auto done = cluster.WaitForEnd(*id);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n"
                                          << cli::TailFile(cluster.CoordinatorLog(), 60);
  EXPECT_EQ(done->step(), total);
  // One attempt per fault at least (a kill can also cost a configuration),
  // each ended with its reason; the last one finished the job.
  ASSERT_GE(done->attempts_size(), kWorkerKills + 2) << done->DebugString();
  bool coordinator_seen = false;
  for (int i = 0; i < done->attempts_size(); ++i) {
    const v1::JobAttempt& a = done->attempts(i);
    EXPECT_EQ(a.attempt(), i);
    std::cout << "[chaos] attempt " << a.attempt() << ": steps " << a.from_step() << " -> "
              << a.reached_step() << ", " << (a.end_reason().empty() ? "finished" : a.end_reason())
              << "\n";
    if (i + 1 < done->attempts_size()) {
      EXPECT_FALSE(a.end_reason().empty()) << i;
      coordinator_seen =
          coordinator_seen || a.end_reason().find("coordinator restarted") != std::string::npos;
    } else {
      EXPECT_TRUE(a.end_reason().empty()) << a.end_reason();
      EXPECT_EQ(a.reached_step(), total);
    }
  }
  EXPECT_TRUE(coordinator_seen);
  std::cout << "[chaos] steps redone: " << done->steps_redone() << " of " << total << "\n";
  auto got = testing::CheckpointTensors(ckpt, *id, total);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, *want, 1e-6);
}

}  // namespace
}  // namespace stagewise
