// StageReplacer (coordinator/stage_replacement.h) with a FakeJobHost and a
// real WorkerRegistry: a lost worker's stage goes to an idle worker with the
// newest committed checkpoint's shard, its neighbours are told where it runs
// once it acknowledged, it starts once they did, and the replacement ends
// when the job's step passes where it was; it declines (the caller rolls
// back) without replay, without an idle worker, or while one is under way.
#include "coordinator/stage_replacement.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "services/checkpoint/checkpoint.h"
#include "tests/unit/coordinator_fakes.h"
#include "tests/unit/fake_job_host.h"

namespace stagewise::coordinator {
namespace {

class StageReplacementTest : public ::testing::Test {
 protected:
  StageReplacementTest()
      : root_(::testing::TempDir() + "replace_test_" + std::to_string(::getpid())) {
    std::filesystem::remove_all(root_);
    for (const std::string id : {"w0", "w1", "w2", "w3"}) AddWorker(id);
  }
  ~StageReplacementTest() override { std::filesystem::remove_all(root_); }

  void AddWorker(const std::string& id) {
    std::optional<WorkerRegistry::Removed> replaced;
    std::string session;
    ASSERT_TRUE(registry_.Register(testing::Info(id), {}, absl::Now(), &replaced, &session).ok());
    sinks_.push_back(std::make_unique<testing::FakeSink>());
    ASSERT_TRUE(registry_.Connect(id, session, {}, sinks_.back().get(), absl::Now()).ok());
  }

  // A RUNNING three-stage job on w0, w1, w2 (w3 idle), at step 30.
  LiveJob& Running(const std::string& recovery) {
    auto spec = ParseJobSpec(testing::JobYaml(
        3, 100, "checkpoint: {dir: " + root_ + ", every_steps: 10}\nrecovery: " + recovery + "\n"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    LiveJob job;
    job.spec = *spec;
    job.yaml = testing::JobYaml(3, 100);
    job.status.set_job_id("job-1");
    job.status.set_state(v1::RUNNING);
    job.status.set_total_steps(100);
    job.status.set_step(30);
    v1::JobAttempt* a = job.status.add_attempts();
    for (const std::string w : {"w0", "w1", "w2"}) a->add_workers(w);
    job.cut.ranges = {{0, 2}, {2, 3}, {3, 4}};
    job.attempt.workers = registry_.Claim("job-1", 3);
    EXPECT_EQ(job.attempt.workers, (std::vector<std::string>{"w0", "w1", "w2"}));
    host_.jobs["job-1"] = std::move(job);
    return host_.jobs.at("job-1");
  }

  // A committed checkpoint of the job's cut after `step` steps.
  void Commit(int64_t step) {
    const std::string dir = checkpoint::StepDir(root_, "job-1", step);
    v1::CheckpointManifest m;
    m.set_format(checkpoint::kFormat);
    m.set_job_id("job-1");
    m.set_step(step);
    m.set_total_steps(100);
    const std::vector<std::pair<int, int>> ranges = {{0, 2}, {2, 3}, {3, 4}};
    for (int j = 0; j < 3; ++j) {
      const std::string data = "shard " + std::to_string(j);
      ASSERT_TRUE(
          checkpoint::WriteFileAtomically(dir + "/" + checkpoint::ShardFileName(j), data).ok());
      v1::CheckpointShard* s = m.add_shards();
      s->set_stage(j);
      s->set_file(checkpoint::ShardFileName(j));
      s->set_bytes(static_cast<int64_t>(data.size()));
      s->set_crc32(checkpoint::Crc32(data));
      s->set_block_begin(ranges[j].first);
      s->set_block_end(ranges[j].second);
    }
    ASSERT_TRUE(checkpoint::WriteManifest(dir, m).ok());
  }

  void Ack(int64_t id, const std::string& from) { EXPECT_TRUE(replacer_.OnAck(id, from)); }

  const std::string root_;
  std::vector<std::unique_ptr<testing::FakeSink>> sinks_;
  WorkerRegistry registry_;
  Scheduler scheduler_{&registry_};
  testing::FakeJobHost host_;
  StageReplacer replacer_{&host_, &registry_, &scheduler_};
};

TEST_F(StageReplacementTest, TheLostStageGoesToASpareAndStartsOnceItsNeighboursKnow) {
  LiveJob& job = Running("{replay: true}");
  Commit(20);
  ASSERT_TRUE(replacer_.TryReplace("job-1", job, "w1", "lost worker w1"));
  EXPECT_EQ(job.attempt.workers[1], "w3");
  EXPECT_EQ(job.status.attempts(0).workers(1), "w3");
  ASSERT_EQ(host_.sent.size(), 1u);
  EXPECT_EQ(host_.sent[0].first, "w3");
  const v1::StageAssignment& a = host_.sent[0].second.configure();
  EXPECT_EQ(a.stage(), 1);
  EXPECT_TRUE(a.replacing());
  EXPECT_TRUE(a.replay());
  EXPECT_EQ(a.resume().step(), 20);
  EXPECT_EQ(a.resume().shard_path(),
            checkpoint::StepDir(root_, "job-1", 20) + "/" + checkpoint::ShardFileName(1));
  // A second loss meanwhile is a rollback.
  EXPECT_FALSE(replacer_.TryReplace("job-1", job, "w0", "lost worker w0"));
  // Acknowledged: stages 0 and 2 learn where stage 1 runs now.
  EXPECT_FALSE(replacer_.OnAck(host_.sent[0].second.command_id(), "w0"));  // not its worker
  Ack(host_.sent[0].second.command_id(), "w3");
  ASSERT_EQ(host_.sent.size(), 3u);
  EXPECT_EQ(host_.sent[1].first, "w0");
  EXPECT_EQ(host_.sent[2].first, "w2");
  for (int i : {1, 2}) {
    const v1::NeighbourReplaced& n = host_.sent[i].second.neighbour_replaced();
    EXPECT_EQ(n.stage(), 1);
    EXPECT_EQ(n.job_id(), "job-1");
  }
  Ack(host_.sent[1].second.command_id(), "w0");
  EXPECT_EQ(host_.sent.size(), 3u);  // not before both
  Ack(host_.sent[2].second.command_id(), "w2");
  ASSERT_EQ(host_.sent.size(), 4u);
  EXPECT_EQ(host_.sent[3].first, "w3");
  EXPECT_TRUE(host_.sent[3].second.has_start());
  // It caught up, then the job passed step 30.
  v1::ReplayDone done;
  done.set_from_step(20);
  done.set_to_step(31);
  done.set_bytes(1000);
  done.set_seconds(0.5);
  replacer_.OnReplayDone(job, 1, done);
  replacer_.OnProgress(job);
  EXPECT_TRUE(job.attempt.replacement.has_value());  // step 30: not passed yet
  job.status.set_step(32);
  replacer_.OnProgress(job);
  EXPECT_FALSE(job.attempt.replacement.has_value());
  const v1::StageReplacement& r = job.status.attempts(0).replacements(0);
  EXPECT_EQ(r.stage(), 1);
  EXPECT_EQ(r.lost_worker(), "w1");
  EXPECT_EQ(r.worker(), "w3");
  EXPECT_EQ(r.from_step(), 20);
  EXPECT_EQ(r.job_step(), 30);
  EXPECT_EQ(r.steps_redone(), 11);
  EXPECT_EQ(r.bytes(), 1000);
  EXPECT_GT(r.full_speed_seconds(), 0);
}

// Two stages, two replicas (slots r * 2 + j on w0..w3, w4 idle): a lost
// replica's spare copies the stage's other replica, which regroups with it;
// only the lost replica's own pipeline neighbour reconnects.
TEST_F(StageReplacementTest, ALostReplicaCopiesASurvivorAndItsStageRegroups) {
  AddWorker("w4");
  const std::string yaml =
      "name: small\nseed: 1\nmodel: {name: mlp, hidden: [32, 32, 16]}\n"
      "data: {dataset: synthetic, train_size: 32, test_size: 16, shape: [1, 8, 8], classes: 4}\n"
      "optimizer: {lr: 0.05}\nbatch_size: 16\nsteps: 100\nstages: {count: 2, replicas: 2}\n"
      "checkpoint: {dir: " +
      root_ + ", every_steps: 10}\nrecovery: {replay: true}\n";
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  LiveJob job;
  job.spec = *spec;
  job.yaml = yaml;
  job.status.set_job_id("job-1");
  job.status.set_state(v1::RUNNING);
  job.status.set_step(30);
  job.cut.ranges = {{0, 2}, {2, 4}};
  job.attempt.workers = registry_.Claim("job-1", 4);
  ASSERT_EQ(job.attempt.workers, (std::vector<std::string>{"w0", "w1", "w2", "w3"}));
  v1::JobAttempt* attempt = job.status.add_attempts();
  for (const std::string& w : job.attempt.workers) attempt->add_workers(w);
  host_.jobs["job-1"] = std::move(job);
  LiveJob& live = host_.jobs.at("job-1");

  // w2 holds stage 0 of replica 1: w0 (stage 0, replica 0) is the source.
  ASSERT_TRUE(replacer_.TryReplace("job-1", live, "w2", "lost worker w2"));
  EXPECT_EQ(live.attempt.workers[2], "w4");
  ASSERT_EQ(host_.sent.size(), 2u);
  EXPECT_EQ(host_.sent[0].first, "w4");
  const v1::StageAssignment& a = host_.sent[0].second.configure();
  EXPECT_EQ(a.stage(), 0);
  EXPECT_EQ(a.replica(), 1);
  EXPECT_TRUE(a.replacing());
  EXPECT_FALSE(a.has_resume());
  EXPECT_EQ(a.replica_source().replica(), 0);
  EXPECT_EQ(a.replica_source().generation(), 1);
  EXPECT_EQ(a.replica_source().address(), testing::Info("w0").address());
  EXPECT_EQ(a.replica_source().token().size(), 32u);
  EXPECT_EQ(host_.sent[1].first, "w0");
  const v1::ReplicaRegroup& g = host_.sent[1].second.replica_regroup();
  EXPECT_EQ(g.stage(), 0);
  EXPECT_EQ(g.generation(), 1);
  EXPECT_EQ(g.source_replica(), 0);
  EXPECT_EQ(g.token(), a.replica_source().token());
  // Acknowledged: stage 1 of replica 1 (w3) reconnects, not replica 0's.
  Ack(host_.sent[0].second.command_id(), "w4");
  ASSERT_EQ(host_.sent.size(), 3u);
  EXPECT_EQ(host_.sent[2].first, "w3");
  EXPECT_EQ(host_.sent[2].second.neighbour_replaced().stage(), 0);
  Ack(host_.sent[2].second.command_id(), "w3");
  ASSERT_EQ(host_.sent.size(), 4u);
  EXPECT_TRUE(host_.sent[3].second.has_start());
  v1::ReplayDone done;
  done.set_from_step(30);
  done.set_to_step(31);
  done.set_copied_bytes(4096);
  done.set_copy_seconds(0.25);
  replacer_.OnReplayDone(live, 0, done);
  const v1::StageReplacement& r = live.status.attempts(0).replacements(0);
  EXPECT_EQ(r.stage(), 0);
  EXPECT_EQ(r.replica(), 1);
  EXPECT_EQ(r.copied_from_replica(), 0);
  EXPECT_EQ(r.from_step(), 30);
  EXPECT_EQ(r.steps_redone(), 1);
  EXPECT_EQ(r.copied_bytes(), 4096);
  live.status.set_step(31);
  replacer_.OnProgress(live);
  EXPECT_FALSE(live.attempt.replacement.has_value());
  // The next loss of that stage's replica regroups as generation 2.
  AddWorker("w5");
  ASSERT_TRUE(replacer_.TryReplace("job-1", live, "w0", "lost worker w0"));
  EXPECT_EQ(host_.sent[4].second.configure().replica_source().replica(), 1);
  EXPECT_EQ(host_.sent[4].second.configure().replica_source().generation(), 2);
}

TEST_F(StageReplacementTest, ANewerShardOfItsOwnBeatsTheCommittedCheckpoint) {
  LiveJob& job = Running("{replay: true}");
  Commit(20);
  // Stage 2 wrote its shard of step 30; stage 0's is not in yet.
  v1::CheckpointSaved saved;
  saved.set_step(30);
  saved.set_phase_step(30);
  saved.set_path("/somewhere/step-30/stage-2.pt");
  saved.set_bytes(77);
  saved.set_crc32(5);
  job.attempt.shards[30][2] = saved;
  ASSERT_TRUE(replacer_.TryReplace("job-1", job, "w2", "lost worker w2"));
  const v1::ResumePoint& r = host_.sent[0].second.configure().resume();
  EXPECT_EQ(r.step(), 30);
  EXPECT_EQ(r.shard_path(), "/somewhere/step-30/stage-2.pt");
  EXPECT_EQ(r.shard_bytes(), 77);
  EXPECT_EQ(job.status.attempts(0).replacements(0).from_step(), 30);
  // Stage 1 has no newer shard: the committed checkpoint's.
  host_.jobs.erase("job-1");
  registry_.Release("job-1");
  LiveJob& again = Running("{replay: true}");
  again.attempt.shards[30][2] = saved;
  host_.sent.clear();
  ASSERT_TRUE(replacer_.TryReplace("job-1", again, "w1", "lost worker w1"));
  EXPECT_EQ(host_.sent[0].second.configure().resume().step(), 20);
}

TEST_F(StageReplacementTest, ItDeclinesWithoutReplayOrASpare) {
  LiveJob& job = Running("{replay: false}");
  EXPECT_FALSE(replacer_.TryReplace("job-1", job, "w1", "lost"));
  host_.jobs.erase("job-1");
  registry_.Release("job-1");
  LiveJob& replay = Running("{replay: true}");
  ASSERT_EQ(registry_.Claim("other", 1), (std::vector<std::string>{"w3"}));  // no idle worker
  EXPECT_FALSE(replacer_.TryReplace("job-1", replay, "w1", "lost"));
  EXPECT_EQ(replay.attempt.workers[1], "w1");
  EXPECT_TRUE(host_.sent.empty());
  EXPECT_FALSE(replay.attempt.replacement.has_value());
}

TEST_F(StageReplacementTest, WithoutACommittedCheckpointTheSpareStartsFromTheStart) {
  LiveJob& job = Running("{replay: true}");
  ASSERT_TRUE(replacer_.TryReplace("job-1", job, "w2", "lost worker w2"));
  EXPECT_FALSE(host_.sent[0].second.configure().has_resume());
  // An attempt that itself resumed from a checkpoint cannot: it rolls back.
  host_.jobs.erase("job-1");
  registry_.Release("job-1");
  LiveJob& resumed = Running("{replay: true}");
  resumed.status.mutable_attempts(0)->set_from_step(10);
  EXPECT_FALSE(replacer_.TryReplace("job-1", resumed, "w2", "lost worker w2"));
}

}  // namespace
}  // namespace stagewise::coordinator
