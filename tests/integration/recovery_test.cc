// Recovery defects a black-box chaos run found (docs/fault_tolerance.md),
// each a regression test on real processes: two workers lost together cost
// one restart, a watch is back within 5 s of the coordinator's return, the
// recorded cause of an attempt names the lost worker, and recovery leaves no
// stale corruption marks or unlisted files behind. Then replicated stages
// (docs/replicas.md): a stuck replica times the collective out and the job
// recovers on a spare; recovery.elastic goes on with fewer replicas.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "clients/client/coordinator_client.h"
#include "services/checkpoint/checkpoint.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

namespace fs = std::filesystem;
using testing::ProcessCluster;
using Options = ProcessCluster::Options;

// A 2-stage job whose steps take a few milliseconds whatever the machine
// (emulated blocks wait), checkpointed every 20 steps.
std::string Job(const std::string& checkpoint_dir, int64_t steps, int max_restarts, int keep = 3) {
  return absl::StrCat(R"(name: recovery
model: {name: emulated, depth: 4, forward_ms: 1, backward_ms: 2, reversible: false}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [2, 4, 4], classes: 4}
stages: 2
batch_size: 16
steps: )",
                      steps, "\ncheckpoint: {dir: ", checkpoint_dir,
                      ", every_steps: 20, keep: ", keep,
                      "}\nrecovery: {max_restarts: ", max_restarts, ", wait_seconds: 60}\n");
}

// The same on 2 stages x 2 replicas (4 workers by slot: replica r's stage j
// at 2r + j), `extra` appended (e.g. recovery.elastic).
std::string ReplicatedJob(const std::string& checkpoint_dir, int64_t steps,
                          const std::string& recovery) {
  return absl::StrCat(R"(name: replicated-recovery
model: {name: emulated, depth: 4, forward_ms: 1, backward_ms: 2, reversible: false}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [2, 4, 4], classes: 4}
stages: {count: 2, replicas: 2}
batch_size: 16
steps: )",
                      steps, "\ncheckpoint: {dir: ", checkpoint_dir,
                      ", every_steps: 20, keep: 3}\nrecovery: ", recovery, "\n");
}

// The index of worker "w<i>".
int WorkerIndex(const std::string& worker_id) {
  return worker_id.size() > 1 && worker_id[0] == 'w' ? std::atoi(worker_id.c_str() + 1) : -1;
}

absl::StatusOr<v1::JobStatus> WaitCheckpointed(ProcessCluster& cluster, const std::string& id,
                                               int64_t step) {
  return cluster.WaitFor(id, [step](const v1::JobStatus& s) {
    return s.state() == v1::RUNNING && s.last_checkpoint_step() >= step;
  });
}

// Finding: with two workers killed together, the coordinator placed the
// recovery attempt on the second dead worker ~13 ms before it noticed that
// loss, so one fault cost two restarts and `max_restarts: 1` failed the job.
// A recovering job now waits --recovery-settle before it is placed again.
TEST(Recovery, TwoWorkersLostTogetherCostOneRestart) {
  Options o;
  o.workers = 4;  // two for the job, two spares
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(Job(cluster.dir() + "/ckpt", 400, /*max_restarts=*/1));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = WaitCheckpointed(cluster, *id, 20);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  const v1::JobAttempt first = running->attempts(running->attempts_size() - 1);
  ASSERT_EQ(first.workers_size(), 2);
  std::vector<int> victims;
  for (const std::string& w : first.workers()) victims.push_back(WorkerIndex(w));
  for (int v : victims) ASSERT_TRUE(cluster.KillWorker(v).ok());
  auto end = cluster.WaitForEnd(*id, absl::Seconds(240));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason() << "\n" << cluster.CoordinatorLog();
  ASSERT_EQ(end->attempts_size(), 2) << end->DebugString();
  EXPECT_EQ(end->attempts(0).cause(), v1::END_CAUSE_WORKER_LOST);
  for (const std::string& w : end->attempts(1).workers()) {
    for (const std::string& dead : first.workers()) EXPECT_NE(w, dead) << "placed on a lost worker";
  }
}

// Finding: `stagewise watch` came back ~9 s after the coordinator returned
// from a 2 s outage (gRPC's reconnect backoff on the reused channel), though
// docs/cli.md promises retries at most a few seconds apart.
TEST(Recovery, AWatchIsBackWithinFiveSecondsOfTheCoordinatorsReturn) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(R"(name: watched
model: {name: emulated, depth: 1, forward_ms: 2, backward_ms: 2, reversible: false}
data: {dataset: synthetic, train_size: 512, test_size: 32, shape: [2, 4, 4], classes: 4}
batch_size: 16
steps: 100000000
)");
  ASSERT_TRUE(id.ok()) << id.status();
  client::CoordinatorClient watcher(cluster.coordinator_address(), absl::Seconds(10),
                                    cluster.RpcOptionsFor("client"));
  absl::Mutex mu;
  int events = 0;
  std::optional<absl::Time> lost, back;
  std::thread watch([&] {
    client::ReconnectPolicy policy;
    policy.give_up_after = absl::Seconds(60);
    (void)watcher.WatchReconnecting(
        *id,
        [&](const v1::JobEvent&) {
          absl::MutexLock lock(&mu);
          ++events;
          return true;
        },
        policy,
        [&](const client::ConnectionChange& change) {
          absl::MutexLock lock(&mu);
          (change.lost ? lost : back) = absl::Now();
        });
  });
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n > 0; }, &events),
                                    absl::Seconds(30)));
  }
  ASSERT_TRUE(cluster.KillAndRestartCoordinator(absl::Seconds(2)).ok());
  const absl::Time returned = absl::Now();  // it answers again
  bool reconnected = false;
  {
    absl::MutexLock lock(&mu);
    reconnected = mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::optional<absl::Time>* t) { return t->has_value(); }, &back),
        absl::Seconds(30));
  }
  watcher.StopWatching();
  watch.join();
  (void)cluster.client().Cancel(*id, "done");
  ASSERT_TRUE(reconnected) << "the watch never came back";
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(lost.has_value());
  std::cout << "[recovery] the watch was back " << absl::FormatDuration(*back - returned)
            << " after the coordinator\n";
  EXPECT_LT(*back - returned, absl::Seconds(5));
}

// Finding: when stage 0's worker was killed, stage 1's stream error could
// arrive first and the attempt's recorded cause named neither the lost worker
// nor its loss (1 of 4 runs). Three kills in a row, each must be named.
TEST(Recovery, TheRecordedCauseNamesTheLostWorker) {
  Options o;
  o.workers = 3;
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(Job(cluster.dir() + "/ckpt", 100000000, /*max_restarts=*/5));
  ASSERT_TRUE(id.ok()) << id.status();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto running = cluster.WaitFor(*id, [round](const v1::JobStatus& s) {
      return s.state() == v1::RUNNING && s.attempts_size() == round + 1 && s.step() > 0 &&
             s.attempts(round).reached_step() > s.attempts(round).from_step() + 5;
    });
    ASSERT_TRUE(running.ok()) << running.status();
    ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
    const std::string victim = running->attempts(round).workers(0);  // stage 0
    const int index = WorkerIndex(victim);
    ASSERT_GE(index, 0) << victim;
    ASSERT_TRUE(cluster.KillWorker(index).ok());
    auto next = cluster.WaitFor(*id, [round](const v1::JobStatus& s) {
      return s.state() == v1::RUNNING && s.attempts_size() == round + 2;
    });
    ASSERT_TRUE(next.ok()) << next.status();
    const v1::JobAttempt& ended = next->attempts(round);
    EXPECT_EQ(ended.cause(), v1::END_CAUSE_WORKER_LOST) << ended.DebugString();
    EXPECT_TRUE(absl::StrContains(ended.end_reason(), absl::StrCat("lost worker ", victim)))
        << ended.end_reason();
    ASSERT_TRUE(cluster.StartWorker(index).ok());  // the spare for the next round
  }
  (void)cluster.client().Cancel(*id, "done");
}

// Findings: a corrupt checkpoint's CORRUPT / MANIFEST.corrupt stayed beside
// the checkpoint later re-committed at the same step; files outside the
// documented layout were never pruned; and the attempt that failed on the
// corrupt checkpoint counted as a restart of its own. One kill, one corrupt
// shard and `max_restarts: 1` now end SUCCEEDED with a clean directory.
TEST(Recovery, ACorruptCheckpointCostsNoRestartAndLeavesNothingBehind) {
  Options o;
  o.workers = 3;
  o.coordinator_args = {"--recovery-settle", "3"};  // time to damage the shard
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string root = cluster.dir() + "/ckpt";
  auto id = cluster.client().Submit(Job(root, 200, /*max_restarts=*/1, /*keep=*/100));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = WaitCheckpointed(cluster, *id, 60);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  const std::string job_dir = checkpoint::JobDir(root, *id);
  std::ofstream(job_dir + "/stage-7.pt") << "not ours";  // outside any step
  ASSERT_TRUE(cluster.KillWorker(WorkerIndex(running->attempts(0).workers(0))).ok());
  absl::SleepFor(absl::Milliseconds(500));  // the attempt has ended: no more commits
  std::vector<checkpoint::Committed> committed =
      checkpoint::ListCommitted(root, *id, false, nullptr);
  ASSERT_FALSE(committed.empty());
  const std::string damaged = committed.front().dir;
  std::ofstream(damaged + "/stage-9.pt") << "unlisted";  // inside a kept checkpoint
  fs::resize_file(damaged + "/stage-0.pt", 10);
  auto end = cluster.WaitForEnd(*id, absl::Seconds(240));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason() << "\n" << cluster.CoordinatorLog();
  ASSERT_EQ(end->attempts_size(), 3) << end->DebugString();
  EXPECT_EQ(end->attempts(1).cause(), v1::END_CAUSE_CORRUPT_CHECKPOINT)
      << end->attempts(1).DebugString();
  // Every step directory holds its MANIFEST and the shards it lists, nothing else.
  int steps = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(job_dir)) {
    ASSERT_TRUE(e.is_directory()) << "unlisted file " << e.path();
    auto manifest = checkpoint::ReadManifest(e.path().string());
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    std::set<std::string> want = {checkpoint::kManifestName};
    for (const v1::CheckpointShard& shard : manifest->shards()) want.insert(shard.file());
    std::set<std::string> have;
    for (const fs::directory_entry& f : fs::directory_iterator(e.path())) {
      have.insert(f.path().filename().string());
    }
    EXPECT_EQ(have, want) << e.path();
    ++steps;
  }
  EXPECT_GE(steps, 10);
}

// A replica that stops answering (SIGSTOP: alive, connected, silent) leaves
// its peers in the gradient all-reduce; --collective-timeout turns that into
// a stage error (DEADLINE_EXCEEDED, retryable) well before the heartbeat
// timeout, and the job recovers on the spare with both replicas.
TEST(Recovery, AStuckReplicaTimesOutTheCollectiveAndTheJobRecoversOnASpare) {
  Options o;
  o.workers = 5;  // 2 x 2 and a spare
  o.heartbeat_timeout_s = 20;
  o.worker_args = {"--collective-timeout", "3"};
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(
      ReplicatedJob(cluster.dir() + "/ckpt", 300, "{max_restarts: 3, wait_seconds: 60}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = WaitCheckpointed(cluster, *id, 20);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  ASSERT_EQ(running->num_replicas(), 2);
  ASSERT_EQ(running->attempts(0).workers_size(), 4);
  const std::string stuck = running->attempts(0).workers(3);  // replica 1, stage 1
  const pid_t pid = cluster.worker_pid(WorkerIndex(stuck));
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  auto next = cluster.WaitFor(
      *id, [](const v1::JobStatus& s) { return s.attempts_size() >= 2; }, absl::Seconds(60));
  ASSERT_TRUE(next.ok()) << next.status();
  const v1::JobAttempt& ended = next->attempts(0);
  EXPECT_EQ(ended.cause(), v1::END_CAUSE_STAGE_ERROR) << ended.DebugString();
  EXPECT_TRUE(absl::StrContains(ended.end_reason(), "among 2 replicas failed") &&
              absl::StrContains(ended.end_reason(), "timeout 3 s"))
      << ended.end_reason();
  ASSERT_TRUE(cluster.KillWorker(WorkerIndex(stuck)).ok());  // gone for good
  auto end = cluster.WaitForEnd(*id, absl::Seconds(240));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason() << "\n" << cluster.CoordinatorLog();
  EXPECT_EQ(end->num_replicas(), 2);
  const v1::JobAttempt& last = end->attempts(end->attempts_size() - 1);
  ASSERT_EQ(last.workers_size(), 4);
  for (const std::string& w : last.workers()) EXPECT_NE(w, stuck);
}

// recovery.elastic: with no spare for a lost replica's worker, the next
// attempt runs one replica of each stage on the remaining workers (the same
// global batch), and the job ends SUCCEEDED instead of waiting.
TEST(Recovery, AnElasticJobGoesOnWithFewerReplicas) {
  Options o;
  o.workers = 4;
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(ReplicatedJob(
      cluster.dir() + "/ckpt", 200, "{max_restarts: 2, wait_seconds: 30, elastic: true}"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = WaitCheckpointed(cluster, *id, 20);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  ASSERT_EQ(running->attempts(0).workers_size(), 4);
  ASSERT_TRUE(cluster.KillWorker(WorkerIndex(running->attempts(0).workers(2))).ok());
  auto shrunk = cluster.WaitFor(*id, [](const v1::JobStatus& s) {
    return s.attempts_size() >= 2 && s.state() == v1::RUNNING;
  });
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->num_replicas(), 1) << shrunk->DebugString();
  auto end = cluster.WaitForEnd(*id, absl::Seconds(240));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason() << "\n" << cluster.CoordinatorLog();
  ASSERT_EQ(end->attempts_size(), 2) << end->DebugString();
  EXPECT_EQ(end->attempts(1).workers_size(), 2);
  EXPECT_EQ(end->num_replicas(), 1);
  EXPECT_EQ(end->step(), 200);
  std::stringstream log;
  log << std::ifstream(cluster.CoordinatorLog()).rdbuf();
  EXPECT_TRUE(absl::StrContains(log.str(), "recovery.elastic: this attempt runs 1 of 2"))
      << cluster.CoordinatorLog();
}

}  // namespace
}  // namespace stagewise
