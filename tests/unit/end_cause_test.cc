// End causes (coordinator/end_cause.h): the policy on each enum value, the
// labels, and records stored before the enum; an attempt's end drops all of
// its state, and a planned stop's handover reaches only the next attempt.
#include "coordinator/end_cause.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/checkpoint_commit.h"
#include "coordinator/job_recovery.h"
#include "coordinator/planned_stop.h"
#include "services/checkpoint/checkpoint.h"
#include "services/metrics/metrics.h"
#include "stagewise/v1/coordinator.pb.h"
#include "tests/unit/coordinator_fakes.h"
#include "tests/unit/fake_job_host.h"

namespace stagewise::coordinator {
namespace {

TEST(EndCauseTest, EveryCauseHasAPolicyAndALabelThatNamesIt) {
  std::set<std::string> labels;
  const google::protobuf::EnumDescriptor* causes = v1::EndCause_descriptor();
  for (int i = 0; i < causes->value_count(); ++i) {
    const auto cause = static_cast<v1::EndCause>(causes->value(i)->number());
    const v1::EndCausePolicy& policy = PolicyOf(cause);
    // A planned stop never counts as a restart; every fault but a corrupt
    // checkpoint (counted when it was found) does.
    if (policy.planned()) EXPECT_FALSE(policy.counted()) << v1::EndCause_Name(cause);
    if (cause == v1::END_CAUSE_UNSPECIFIED) {
      EXPECT_EQ(CauseLabel(cause), "");
      continue;
    }
    const std::string label = CauseLabel(cause);
    EXPECT_TRUE(labels.insert(label).second) << label;
    v1::JobAttempt old_record;  // stored before `cause` existed: the label only
    old_record.set_end_cause(label);
    EXPECT_EQ(CauseOf(old_record), cause) << label;
    v1::JobAttempt a;
    SetEndCause(&a, cause);
    EXPECT_EQ(a.cause(), cause);
    EXPECT_EQ(a.end_cause(), label);
  }
  EXPECT_EQ(CauseLabel(v1::END_CAUSE_WORKER_LOST), "worker_lost");
  EXPECT_EQ(CauseLabel(v1::END_CAUSE_CORRUPT_CHECKPOINT), "corrupt_checkpoint");
  EXPECT_TRUE(PolicyOf(v1::END_CAUSE_WORKER_LOST).counted());
  EXPECT_TRUE(PolicyOf(v1::END_CAUSE_STALLED).counted());
  EXPECT_FALSE(PolicyOf(v1::END_CAUSE_WORKER_LOST).planned());
  EXPECT_FALSE(PolicyOf(v1::END_CAUSE_CORRUPT_CHECKPOINT).counted());
  EXPECT_FALSE(PolicyOf(v1::END_CAUSE_CORRUPT_CHECKPOINT).planned());
  for (v1::EndCause planned :
       {v1::END_CAUSE_PREEMPTED, v1::END_CAUSE_GROW, v1::END_CAUSE_REBALANCE}) {
    EXPECT_TRUE(PolicyOf(planned).planned()) << v1::EndCause_Name(planned);
    EXPECT_FALSE(PolicyOf(planned).counted()) << v1::EndCause_Name(planned);
  }
}

TEST(EndCauseTest, AnUnknownLabelOrNumberIsUnspecified) {
  v1::JobAttempt a;
  a.set_end_cause("meteor_strike");
  EXPECT_EQ(CauseOf(a), v1::END_CAUSE_UNSPECIFIED);
  // A cause written by a newer coordinator: counted, like an unknown fault.
  EXPECT_TRUE(PolicyOf(static_cast<v1::EndCause>(999)).counted());
  EXPECT_FALSE(PolicyOf(static_cast<v1::EndCause>(999)).planned());
}

// A RUNNING two-stage job that checkpoints into `root`, cut [0,2) [2,4).
class AttemptEndTest : public ::testing::Test {
 protected:
  AttemptEndTest()
      : root_(::testing::TempDir() + "attempt_end_test_" + std::to_string(::getpid())),
        metrics_(registry_),
        recovery_(&host_, &metrics_, absl::Seconds(30)),
        committer_(&host_, &metrics_),
        planned_(&host_, &recovery_) {
    std::filesystem::remove_all(root_);
    auto spec = ParseJobSpec(testing::JobYaml(
        2, 40, "checkpoint: {dir: " + root_ + ", every_steps: 10}\nrecovery: {max_restarts: 3}\n"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    LiveJob job;
    job.spec = *spec;
    job.status.set_job_id("job-1");
    job.status.set_state(v1::RUNNING);
    job.status.set_total_steps(40);
    job.status.set_num_phases(1);
    job.status.add_attempts()->set_attempt(0);
    job.cut.ranges = {{0, 2}, {2, 4}};
    job.attempt.workers = {"w0", "w1"};
    job.attempt.started = absl::Now();
    job.attempt.progressed = absl::Now();
    job.attempt.pending_acks = {{3, "w1"}};
    job.attempt.phase_done[0] = {0};
    job.attempt.imbalanced_since = 5;
    host_.jobs["job-1"] = std::move(job);
  }
  ~AttemptEndTest() override { std::filesystem::remove_all(root_); }

  LiveJob& Job() { return host_.jobs.at("job-1"); }

  // Both stages write and report their shard of `step`.
  void Checkpoint(int64_t step) {
    for (int stage = 0; stage < 2; ++stage) {
      const std::string dir = checkpoint::StepDir(root_, "job-1", step);
      const std::string data = "shard " + std::to_string(stage);
      ASSERT_TRUE(
          checkpoint::WriteFileAtomically(dir + "/" + checkpoint::ShardFileName(stage), data).ok());
      v1::CheckpointSaved saved;
      saved.set_step(step);
      saved.set_phase_step(step);
      saved.set_path(dir + "/" + checkpoint::ShardFileName(stage));
      saved.set_bytes(static_cast<int64_t>(data.size()));
      saved.set_crc32(checkpoint::Crc32(data));
      committer_.OnShardSaved("job-1", Job(), stage, saved);
    }
    planned_.OnCommitted("job-1", Job());
  }

  static Handover Recut() {
    Handover h;
    h.recut = Handover::Recut{{.ranges = {{0, 1}, {1, 4}}}, {{"plan.note", 1.0}}};
    return h;
  }

  const std::string root_;
  prometheus::Registry registry_;
  metrics::CoordinatorMetrics metrics_;
  testing::FakeJobHost host_;
  JobRecovery recovery_;
  CheckpointCommitter committer_;
  PlannedStops planned_;
};

TEST_F(AttemptEndTest, EndingAnAttemptDropsAllOfIt) {
  Checkpoint(10);
  recovery_.Recover("job-1", "lost worker w1", v1::END_CAUSE_WORKER_LOST);
  const LiveJob& job = Job();
  EXPECT_EQ(job.status.state(), v1::RECOVERING);
  EXPECT_EQ(job.attempt_number, 1);
  EXPECT_TRUE(job.attempt.workers.empty());
  EXPECT_TRUE(job.attempt.pending_acks.empty());
  EXPECT_TRUE(job.attempt.phase_done.empty());
  EXPECT_TRUE(job.attempt.shards.empty());
  EXPECT_EQ(job.attempt.imbalanced_since, -1);
  EXPECT_EQ(job.attempt.progressed, absl::InfiniteFuture());
  EXPECT_EQ(job.attempt.replicas, 0);
  ASSERT_TRUE(job.resume.has_value());
  EXPECT_EQ(job.resume->manifest.step(), 10);
  EXPECT_EQ(job.status.attempts(0).cause(), v1::END_CAUSE_WORKER_LOST);
  EXPECT_EQ(job.status.attempts(0).end_cause(), CauseLabel(v1::END_CAUSE_WORKER_LOST));
}

TEST_F(AttemptEndTest, APlannedStopHandsItsCutToTheNextAttempt) {
  ASSERT_TRUE(planned_.Begin("job-1", Job(), "rebalance: test", v1::END_CAUSE_REBALANCE, Recut()));
  planned_.OnPlanned(Job(), 10);
  Checkpoint(10);
  const LiveJob& job = Job();
  EXPECT_EQ(job.status.state(), v1::RECOVERING);
  EXPECT_EQ(job.status.attempts(0).cause(), v1::END_CAUSE_REBALANCE);
  EXPECT_EQ(job.cut.ranges, (std::vector<std::pair<int, int>>{{0, 1}, {1, 4}}));
  EXPECT_EQ(job.status.summary().at("plan.note"), 1.0);
  EXPECT_FALSE(job.next.recut.has_value());  // taken once
  EXPECT_FALSE(job.attempt.planned_stop.has_value());
}

TEST_F(AttemptEndTest, AFaultBeforeThePlannedCheckpointDropsTheHandover) {
  Checkpoint(10);
  ASSERT_TRUE(planned_.Begin("job-1", Job(), "rebalance: test", v1::END_CAUSE_REBALANCE, Recut()));
  planned_.OnPlanned(Job(), 20);
  recovery_.Recover("job-1", "lost worker w0", v1::END_CAUSE_WORKER_LOST);
  const LiveJob& job = Job();
  EXPECT_EQ(job.status.state(), v1::RECOVERING);
  EXPECT_EQ(job.status.attempts(0).cause(), v1::END_CAUSE_WORKER_LOST);
  EXPECT_EQ(job.cut.ranges,
            (std::vector<std::pair<int, int>>{{0, 2}, {2, 4}}));  // the checkpoint's
  EXPECT_FALSE(job.next.recut.has_value());
  EXPECT_EQ(job.status.summary().count("plan.note"), 0u);
}

}  // namespace
}  // namespace stagewise::coordinator
