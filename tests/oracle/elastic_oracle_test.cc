// Elastic jobs, on real processes (a stagewise-coordinator and
// stagewise-workers; docs/fault_tolerance.md).
//
// Resharding ("Fewer stages"): a job of
// four stages with recovery.min_stages loses workers and gets no spare; after
// recovery.wait_seconds it resumes from its checkpoint on the stages it has
// workers for, the checkpoint regrouped onto the new cut, and finishes.
// - backprop: the parameters and BatchNorm buffers at the end equal those of
//   the same job run on four stages without a fault (<= 1e-6 relative),
//   resumed on three stages and on two;
// - the decoupled algorithms: SUCCEEDED with every step taken once, the
//   resume on the smaller cut as documented (each restarts its in-flight
//   state at the resume step).
//
// Preemption: SIGTERM to a worker mid-job has the job checkpointed at its
// next step boundary and resumed from that very step on a spare, not counted
// as a restart, ending equal to the run without it; the worker exits 0.
//
// The kill step and the workers lost are random; the seed is printed and can
// be fixed with STAGEWISE_TEST_SEED=<n>.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "clients/cli/doctor.h"
#include "tests/oracle/oracle_util.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

using testing::ProcessCluster;
using testing::TestSeed;

constexpr int kStages = 4;
constexpr int64_t kEvery = 20;  // checkpoint.every_steps

std::string JobYaml(const std::string& algorithm, const std::string& checkpoint_dir, int min_stages,
                    int stages = kStages, int64_t every = kEvery, int max_restarts = 3) {
  return absl::StrCat(R"(name: reshard-oracle
seed: 5
model: {name: revnet, depth: 18, width: 8, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [3, 16, 16], classes: 4}
stages: )",
                      stages, R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: 160
eval: {every_epochs: 1, at_end: true}
checkpoint: {dir: )",
                      checkpoint_dir, ", every_steps: ", every, R"(, keep: 2}
recovery: {max_restarts: )",
                      max_restarts, ", wait_seconds: 3, min_stages: ", min_stages, R"(}
algorithm: )",
                      algorithm, "\n");
}

// Runs `yaml` on `cluster` without a fault to its end (SUCCEEDED): its
// status, and the parameters and buffers of its final checkpoint.
void RunClean(ProcessCluster& cluster, const std::string& yaml, const std::string& checkpoint_dir,
              v1::JobStatus* status, std::map<std::string, torch::Tensor>* tensors) {
  auto id = cluster.client().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster.WaitForEnd(*id);
  ASSERT_TRUE(end.ok()) << end.status();
  ASSERT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  auto got = testing::CheckpointTensors(checkpoint_dir, *id, end->total_steps());
  ASSERT_TRUE(got.ok()) << got.status();
  *status = *end;
  *tensors = *std::move(got);
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
  v1::JobStatus clean;
  std::map<std::string, torch::Tensor> want;
  ASSERT_NO_FATAL_FAILURE(RunClean(cluster, yaml, ckpt, &clean, &want));
  const int64_t total = clean.total_steps();

  const std::string id = RunLosing(cluster, yaml, lost, rng);
  ASSERT_FALSE(id.empty());
  auto got = testing::CheckpointTensors(ckpt, id, total);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, want, 1e-6);
}

TEST(ElasticOracleTest, BackpropFromFourStagesOntoThree) { RunBackpropOracle(1); }

TEST(ElasticOracleTest, BackpropFromFourStagesOntoTwo) { RunBackpropOracle(2); }

// The decoupled algorithms restart their in-flight state at the resume step
// on the new cut (StageContext::resharded): they finish, every step once.
TEST(ElasticOracleTest, DecoupledAlgorithmsFinishOnTwoStages) {
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

// Lost workers that come back are taken in again: the job that shrank to
// two stages grows back to four at its next step boundary (a planned stop,
// cause grow) and ends equal to the uninterrupted four-stage run.
TEST(ElasticOracleTest, BackpropShrinksToTwoStagesAndGrowsBackToFour) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  ProcessCluster cluster(kStages);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  const std::string yaml = JobYaml("{name: backprop, micro_batches: 2}", ckpt, 2);
  v1::JobStatus clean;
  std::map<std::string, torch::Tensor> want;
  ASSERT_NO_FATAL_FAILURE(RunClean(cluster, yaml, ckpt, &clean, &want));
  const int64_t total = clean.total_steps();

  auto id = cluster.client().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  const int64_t kill_step = std::uniform_int_distribution<int64_t>(kEvery + 1, 50)(rng);
  auto reached = cluster.WaitFor(*id, [&](const v1::JobStatus& st) {
    return st.state() == v1::RUNNING && st.step() >= kill_step;
  });
  ASSERT_TRUE(reached.ok()) << reached.status();
  ASSERT_EQ(reached->state(), v1::RUNNING) << reached->reason();
  const std::vector<int> victims = {1, 3};
  for (int v : victims) ASSERT_TRUE(cluster.KillWorker(v).ok());
  auto shrunk = cluster.WaitFor(*id, [](const v1::JobStatus& st) {
    return st.state() == v1::RUNNING && st.num_stages() == 2;
  });
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  ASSERT_EQ(shrunk->state(), v1::RUNNING) << shrunk->reason();
  const int64_t shrunk_at = shrunk->step();
  ASSERT_TRUE(cluster.StartWorkers(victims).ok());
  auto done = cluster.WaitForEnd(*id);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n"
                                          << cli::TailFile(cluster.CoordinatorLog(), 40);
  EXPECT_EQ(done->step(), total);
  EXPECT_EQ(done->num_stages(), kStages) << done->DebugString();
  ASSERT_GE(done->attempts_size(), 3) << done->DebugString();
  const v1::JobAttempt& grown = done->attempts(done->attempts_size() - 1);
  EXPECT_EQ(grown.workers_size(), kStages);
  EXPECT_EQ(done->attempts(done->attempts_size() - 2).cause(), v1::END_CAUSE_GROW);
  std::cout << "[grow] lost 2 of 4 workers at step " << reached->step() << ", ran on 2 stages from "
            << shrunk_at << ", back on 4 from step " << grown.from_step() << "\n";
  auto got = testing::CheckpointTensors(ckpt, *id, total);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, want, 1e-6);
}

int WorkerIndex(const std::string& worker_id) {
  return worker_id.size() > 1 && worker_id[0] == 'w' ? std::atoi(worker_id.c_str() + 1) : -1;
}

TEST(ElasticOracleTest, ASigtermedWorkersJobResumesFromTheCheckpointItAskedFor) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE(absl::StrCat("STAGEWISE_TEST_SEED=", seed));
  ProcessCluster cluster(3);  // two stages and a spare
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  // No periodic checkpoint before the end; no restart allowed: the
  // preemption's checkpoint is the only way to step 160, and it is no restart.
  const std::string yaml = JobYaml("{name: backprop, micro_batches: 2}", ckpt, 0, 2, 1000, 0);
  v1::JobStatus clean;
  std::map<std::string, torch::Tensor> want;
  ASSERT_NO_FATAL_FAILURE(RunClean(cluster, yaml, ckpt, &clean, &want));
  const int64_t total = clean.total_steps();

  auto id = cluster.client().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  const int64_t at = std::uniform_int_distribution<int64_t>(20, 100)(rng);
  auto reached = cluster.WaitFor(
      *id, [&](const v1::JobStatus& st) { return st.state() == v1::RUNNING && st.step() >= at; });
  ASSERT_TRUE(reached.ok()) << reached.status();
  ASSERT_EQ(reached->state(), v1::RUNNING) << reached->reason();
  const int victim = WorkerIndex(reached->attempts(0).workers(1));  // stage 1
  ASSERT_GE(victim, 0) << reached->DebugString();
  const absl::Time signalled = absl::Now();
  auto exited = cluster.TerminateWorker(victim, absl::Seconds(60));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, "exited with code 0");
  const double exit_s = absl::ToDoubleSeconds(absl::Now() - signalled);
  auto resumed = cluster.WaitFor(*id, [](const v1::JobStatus& st) {
    return st.state() == v1::RUNNING && st.attempts_size() >= 2;
  });
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const double resumed_s = absl::ToDoubleSeconds(absl::Now() - signalled);
  auto done = cluster.WaitForEnd(*id);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n"
                                          << cli::TailFile(cluster.CoordinatorLog(), 40);
  EXPECT_EQ(done->step(), total);
  ASSERT_EQ(done->attempts_size(), 2) << done->DebugString();
  EXPECT_EQ(done->attempts(0).cause(), v1::END_CAUSE_PREEMPTED);
  EXPECT_THAT(done->attempts(0).end_reason(),
              ::testing::HasSubstr(absl::StrCat("worker w", victim, " is being preempted")));
  const int64_t from = done->attempts(1).from_step();
  EXPECT_GE(from, reached->step());
  EXPECT_LT(from, total);
  EXPECT_THAT(done->attempts(0).end_reason(),
              ::testing::HasSubstr(absl::StrCat("checkpoint at step ", from, " committed")));
  for (const std::string& w : done->attempts(1).workers()) EXPECT_NE(WorkerIndex(w), victim);
  std::cout << "[preemption] SIGTERM to worker " << victim << " at step " << reached->step()
            << ": checkpoint at step " << from << ", resumed there (" << done->steps_redone()
            << " steps redone); " << *exited << " after " << exit_s
            << " s, the job running again after " << resumed_s << " s\n";
  auto got = testing::CheckpointTensors(ckpt, *id, total);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, want, 1e-6);
}

// Rebalancing: a worker slowed mid-job (its --emulated-speed-file) is named
// by the doctor as slower than planned; a window later the job moves to the
// cut planned on the measured speeds (one planned stop, cause rebalance), the
// slowed worker's stage getting fewer blocks, and it ends with the
// parameters of the same job run without the slowdown.
TEST(ElasticOracleTest, ASlowedWorkerIsNamedAndTheJobRebalancesAroundIt) {
  // Each worker's speed file, removed with the directory at the end.
  char pattern[] = "/tmp/stagewise-speed-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string speeds = pattern;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{speeds};
  ProcessCluster::Options options;
  options.workers = 4;
  options.worker_args = {"--emulated-speed-file", speeds + "/speed-{i}"};
  ProcessCluster cluster(options);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string ckpt = cluster.dir() + "/checkpoints";
  const std::string yaml = absl::StrCat(R"(name: rebalance-oracle
seed: 3
model: {name: emulated, depth: 8, forward_ms: 2, backward_ms: 4}
data: {dataset: synthetic, shape: [2, 8, 8], train_size: 4096, test_size: 64}
algorithm: {name: backprop, micro_batches: 4, schedule: 1f1b}
stages: {count: 4, partition: auto}
placement: {per_worker_profiles: true}
optimizer: {name: sgd, lr: 0.01}
batch_size: 32
steps: 500
eval: {every_epochs: 0, at_end: true}
checkpoint: {dir: )",
                                        ckpt, R"(, every_steps: 1000, keep: 2}
recovery: {max_restarts: 0}
rebalance: {threshold: 0.15, window_steps: 150}
trace: {steps: [130, 140]}
)");
  v1::JobStatus clean;
  std::map<std::string, torch::Tensor> want;
  ASSERT_NO_FATAL_FAILURE(RunClean(cluster, yaml, ckpt, &clean, &want));
  EXPECT_EQ(clean.attempts_size(), 1) << "rebalanced without a slowdown: " << clean.DebugString();

  auto id = cluster.client().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  auto at100 = cluster.WaitFor(
      *id, [](const v1::JobStatus& st) { return st.state() == v1::RUNNING && st.step() >= 100; });
  ASSERT_TRUE(at100.ok()) << at100.status();
  ASSERT_EQ(at100->state(), v1::RUNNING) << at100->reason();
  const std::string slowed = at100->attempts(0).workers(2);  // stage 2's worker
  const int victim = WorkerIndex(slowed);
  ASSERT_GE(victim, 0);
  {
    std::ofstream speed(absl::StrCat(speeds, "/speed-", victim));
    speed << "0.5\n";
  }
  // Before the rebalance: the doctor, on the trace of steps 130-140.
  std::string diagnosis;
  for (;;) {
    auto st = cluster.client().GetJob(*id);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->attempts_size(), 1) << "rebalanced before the doctor saw the trace:\n"
                                      << diagnosis;
    ASSERT_EQ(st->state(), v1::RUNNING) << st->reason() << "\n" << diagnosis;
    auto trace = cluster.client().GetJobTrace(*id);
    ASSERT_TRUE(trace.ok()) << trace.status();
    const std::map<std::string, double> summary(st->summary().begin(), st->summary().end());
    const cli::Diagnosis d = cli::Diagnose(*trace, summary);
    std::vector<std::string> workers(st->attempts(0).workers().begin(),
                                     st->attempts(0).workers().end());
    diagnosis = cli::DiagnosisText(*trace, d, workers);
    if (d.slower_than_planned.count(2) > 0) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_THAT(diagnosis,
              ::testing::HasSubstr(absl::StrCat("slower than planned: stage 2 (on ", slowed, ")")));
  auto done = cluster.WaitForEnd(*id);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason() << "\n"
                                          << cli::TailFile(cluster.CoordinatorLog(), 40);
  ASSERT_EQ(done->attempts_size(), 2) << done->DebugString();
  EXPECT_EQ(done->attempts(0).cause(), v1::END_CAUSE_REBALANCE);
  EXPECT_THAT(done->attempts(0).end_reason(),
              ::testing::HasSubstr(absl::StrCat("stage 2 (worker ", slowed, ")")));
  const auto& summary = done->summary();
  const int blocks_before = static_cast<int>(clean.summary().at("plan.stage2.block_end") -
                                             clean.summary().at("plan.stage2.block_begin"));
  const int blocks_after =
      static_cast<int>(summary.at("plan.stage2.block_end") - summary.at("plan.stage2.block_begin"));
  EXPECT_LT(blocks_after, blocks_before);
  std::cout << "[rebalance] worker " << slowed << " (stage 2) at half speed from step "
            << at100->step() << ": " << done->attempts(0).end_reason() << "; resumed from step "
            << done->attempts(1).from_step() << ", stage 2 now " << blocks_after << " blocks (was "
            << blocks_before << ")\n"
            << diagnosis;
  auto got = testing::CheckpointTensors(ckpt, *id, 500);
  ASSERT_TRUE(got.ok()) << got.status();
  testing::ExpectClose(*got, want, 1e-6);
}

}  // namespace
}  // namespace stagewise
