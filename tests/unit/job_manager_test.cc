// JobManager with fakes: an in-memory JobStore, fake control streams that
// record commands, no gRPC and no real workers. The manager handles events on
// its own thread; Sync() waits until it has handled everything sent before.
#include "coordinator/job_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/metrics/metrics.h"
#include "services/models/plan.h"
#include "services/planner/plan_proto.h"
#include "services/planner/profile.h"
#include "tests/unit/coordinator_fakes.h"
#include "tests/unit/job_manager_fixture.h"

namespace stagewise::coordinator {
namespace {

using testing::AckEvent;
using ::testing::ElementsAre;
using testing::EqualBlocks;
using testing::ErrorEvent;
using testing::FakeSink;
using ::testing::HasSubstr;
using testing::HeartbeatEvent;
using testing::Info;
using testing::JobManagerTest;
using testing::JobYaml;
using testing::MetricsEvent;
using testing::PhaseDoneEvent;
using testing::ProfileEvent;
using testing::ResultEvent;

// A job waiting for its profile (PROFILING) gets one from `worker`: equal
// blocks of the job's model; the plan follows.
void ProfileEqualBlocks(JobManager& manager, const std::string& worker, const std::string& id,
                        const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto blocks = models::PlanModel(spec->model);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  manager.OnEvent(ProfileEvent(worker, id, planner::ToProto(EqualBlocks(blocks->size()))));
}

TEST_F(JobManagerTest, JobRunsFromPendingToSucceeded) {
  StartManager();
  AddWorker("w0");
  AddWorker("w1");
  const std::string yaml = JobYaml(2, 4);
  const std::string id = Submit(yaml);

  // Placed at once on the two idle workers: CONFIGURING, one assignment each.
  EXPECT_EQ(Status(id).state(), v1::CONFIGURING);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok());
  auto blocks = models::PlanModel(spec->model);
  ASSERT_TRUE(blocks.ok());
  auto ranges = models::ResolvePartition(spec->stages, *blocks);
  ASSERT_TRUE(ranges.ok());
  ASSERT_EQ(ranges->size(), 2u);
  for (int j = 0; j < 2; ++j) {
    const std::string w = "w" + std::to_string(j);
    const auto configure = Sink(w).Of(v1::Command::kConfigure);
    ASSERT_EQ(configure.size(), 1u) << w;
    const v1::StageAssignment& a = configure[0].configure();
    EXPECT_EQ(a.job_id(), id);
    EXPECT_EQ(a.stage(), j);
    EXPECT_EQ(a.num_stages(), 2);
    EXPECT_EQ(a.block_begin(), (*ranges)[j].first);
    EXPECT_EQ(a.block_end(), (*ranges)[j].second);
    EXPECT_EQ(a.next_address(), j == 0 ? "w1.example:7000" : "");
    EXPECT_EQ(a.job_spec_yaml(), yaml);
    EXPECT_TRUE(Sink(w).Of(v1::Command::kStart).empty());
  }

  // One ack is not enough; both are.
  const int64_t first = Sink("w0").Of(v1::Command::kConfigure)[0].command_id();
  manager_->OnEvent(AckEvent("w0", first));
  Sync();
  EXPECT_EQ(Status(id).state(), v1::CONFIGURING);
  AckAll({"w1"});
  EXPECT_EQ(Status(id).state(), v1::RUNNING);
  for (const char* w : {"w0", "w1"}) {
    const auto start = Sink(w).Of(v1::Command::kStart);
    ASSERT_EQ(start.size(), 1u) << w;
    EXPECT_EQ(start[0].start().job_id(), id);
    EXPECT_EQ(start[0].start().phase(), 0);
  }

  // Progress comes from the last stage.
  manager_->OnEvent(MetricsEvent("w0", id, 0, 3, 9.0));  // not the last stage: ignored
  manager_->OnEvent(MetricsEvent("w1", id, 1, 4, 0.25));
  Sync();
  EXPECT_EQ(Status(id).step(), 4);
  EXPECT_DOUBLE_EQ(Status(id).train_loss(), 0.25);
  auto step = Gauge("stagewise_job_step", id);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 4);

  manager_->OnEvent(ResultEvent("w0", id, 0, 0.5));
  Sync();
  EXPECT_EQ(Status(id).state(), v1::RUNNING);
  manager_->OnEvent(ResultEvent("w1", id, 1, 0.75));
  Sync();
  const v1::JobStatus done = Status(id);
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.step(), 4);
  EXPECT_DOUBLE_EQ(done.summary().at("stage1.eval_accuracy"), 0.75);
  EXPECT_THAT(Transitions(id), ElementsAre(v1::CONFIGURING, v1::RUNNING, v1::SUCCEEDED));
  // The metric history reached the store (batched).
  auto losses = store_->Metrics(id, "train_loss");
  ASSERT_TRUE(losses.ok());
  ASSERT_EQ(losses->size(), 1u);
  EXPECT_EQ((*losses)[0].step, 4);
  // A job that succeeded stops nobody; its workers are idle again.
  EXPECT_TRUE(Sink("w0").Of(v1::Command::kStop).empty());
  for (const v1::WorkerInfo& w : manager_->ListWorkers()) {
    EXPECT_EQ(w.labels().at("state"), "idle") << w.worker_id();
  }
}

TEST_F(JobManagerTest, JobWaitsForEnoughIdleWorkersWithTheReason) {
  StartManager();
  AddWorker("w0");
  const std::string id = Submit(JobYaml(2, 4));
  v1::JobStatus st = Status(id);
  EXPECT_EQ(st.state(), v1::PENDING);
  EXPECT_EQ(st.reason(), "waiting for 2 idle workers (1 idle, 1 registered)");
  EXPECT_TRUE(Sink("w0").commands().empty());
  // The reason is progress, written to the store too: the manager writes its
  // batch once its queue runs dry, which may be just after Status() returned.
  auto stored = store_->GetJob(id);
  for (int i = 0; i < 1000 && stored.ok() && stored->status.reason() != st.reason(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    stored = store_->GetJob(id);
  }
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->status.reason(), st.reason());

  EXPECT_EQ(st.queue_position(), 1);

  AddWorker("w1");
  Sync();
  EXPECT_EQ(Status(id).state(), v1::CONFIGURING);
  EXPECT_EQ(Status(id).queue_position(), 0);
  EXPECT_EQ(Sink("w1").Of(v1::Command::kConfigure).size(), 1u);
}

TEST_F(JobManagerTest, FifoWithBackfill) {
  StartManager();
  AddWorker("w0");
  AddWorker("w1");
  AddWorker("w2");
  const std::string a = Submit(JobYaml(2, 4));
  const std::string b = Submit(JobYaml(3, 4));
  const std::string c = Submit(JobYaml(1, 4));
  EXPECT_EQ(Status(a).state(), v1::CONFIGURING);
  EXPECT_EQ(Status(b).state(), v1::PENDING);
  EXPECT_EQ(Status(b).reason(), "waiting for 3 idle workers (1 idle, 3 registered)");
  EXPECT_EQ(Status(c).state(), v1::CONFIGURING);  // backfilled on w2
  EXPECT_EQ(Sink("w2").Of(v1::Command::kConfigure).at(0).configure().job_id(), c);
  // Places in the queue (`stagewise queue`): b waits first; placed jobs have none.
  const std::string d = Submit(JobYaml(2, 4));
  EXPECT_EQ(Status(b).queue_position(), 1);
  EXPECT_EQ(Status(d).queue_position(), 2);
  EXPECT_EQ(Status(a).queue_position(), 0);
  ASSERT_TRUE(manager_->Cancel(d, "").ok());
  EXPECT_EQ(Status(d).queue_position(), 0);

  // a and c end: b, first in line, takes all three workers.
  ASSERT_TRUE(manager_->Cancel(a, "").ok());
  ASSERT_TRUE(manager_->Cancel(c, "").ok());
  Sync();
  EXPECT_EQ(Status(b).state(), v1::CONFIGURING);
  for (const char* w : {"w0", "w1", "w2"}) {
    EXPECT_EQ(Sink(w).Of(v1::Command::kConfigure).back().configure().job_id(), b) << w;
  }
}

TEST_F(JobManagerTest, LostHeartbeatRecoversTheJobNamingTheWorker) {
  JobManagerOptions options = Options();
  options.heartbeat_timeout = absl::Seconds(1);
  options.housekeeping = absl::Milliseconds(20);
  StartManager(options);
  AddWorker("w0");
  AddWorker("w1");
  const std::string id = Submit(JobYaml(2, 4));
  AckAll({"w0", "w1"});
  ASSERT_EQ(Status(id).state(), v1::RUNNING);
  // w0 keeps beating, w1 falls silent.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Status(id).state() == v1::RUNNING && absl::Now() < deadline) {
    manager_->OnEvent(HeartbeatEvent("w0"));
    absl::SleepFor(absl::Milliseconds(20));
  }
  v1::JobStatus st = Status(id);
  EXPECT_EQ(st.state(), v1::RECOVERING);
  // The reason now says what it waits for; the attempt keeps why it ended.
  EXPECT_THAT(st.reason(), HasSubstr("waiting for 2 idle workers"));
  EXPECT_EQ(st.attempt(), 1);
  ASSERT_EQ(st.attempts_size(), 1);
  const std::string ended = st.attempts(0).end_reason();
  EXPECT_THAT(ended, HasSubstr("lost worker w1 (stage 1)"));
  EXPECT_THAT(ended, HasSubstr("no heartbeat"));
  EXPECT_TRUE(Sink("w1").closed());
  const auto stop = Sink("w0").Of(v1::Command::kStop);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_THAT(stop[0].stop().reason(), HasSubstr(ended));
  auto workers = manager_->ListWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id(), "w0");

  // w1 comes back: attempt 1 is configured, from step 0 (no checkpoints).
  manager_->OnEvent(HeartbeatEvent("w0"));
  AddWorker("w1");
  Sync();
  st = Status(id);
  ASSERT_EQ(st.state(), v1::CONFIGURING);
  ASSERT_EQ(st.attempts_size(), 2);
  EXPECT_EQ(st.attempts(1).from_step(), 0);
  for (const char* w : {"w0", "w1"}) {
    const auto configure = Sink(w).Of(v1::Command::kConfigure);
    ASSERT_FALSE(configure.empty()) << w;
    EXPECT_EQ(configure.back().configure().attempt(), 1) << w;
    EXPECT_FALSE(configure.back().configure().has_resume()) << w;
  }
}

TEST_F(JobManagerTest, ClosedStreamRecoversAndDeterministicErrorsFail) {
  StartManager();
  AddWorker("w0");
  AddWorker("w1");
  const std::string first = Submit(JobYaml(2, 4));
  AckAll({"w0", "w1"});
  manager_->OnEvent(ErrorEvent("w1", first, 1, "stage 1: tensors['x'] is short"));
  Sync();
  v1::JobStatus st = Status(first);
  EXPECT_EQ(st.state(), v1::FAILED);  // INTERNAL: not retried
  EXPECT_EQ(st.reason(), "stage 1: tensors['x'] is short");
  EXPECT_EQ(Sink("w0").Of(v1::Command::kStop).size(), 1u);
  EXPECT_EQ(Sink("w1").Of(v1::Command::kStop).size(), 1u);

  // Both workers are idle again and take the next job; then w0's stream ends.
  const std::string second = Submit(JobYaml(2, 4, "recovery: {wait_seconds: 600}\n"));
  EXPECT_EQ(Status(second).state(), v1::CONFIGURING);
  FakeSink stale;
  manager_->Disconnect("w0", &stale, absl::UnavailableError("old stream"));  // not its stream
  Sync();
  EXPECT_EQ(Status(second).state(), v1::CONFIGURING);
  manager_->Disconnect("w0", &Sink("w0"), absl::UnavailableError("gone"));
  Sync();
  st = Status(second);
  EXPECT_EQ(st.state(), v1::RECOVERING);
  ASSERT_EQ(st.attempts_size(), 1);
  EXPECT_THAT(st.attempts(0).end_reason(),
              HasSubstr("lost worker w0 (stage 0): its control stream closed"));
}

// Two workers lost together are two losses of one fault: the recovery waits
// --recovery-settle, so the second loss is known before the job is placed
// again and none of the lost workers is chosen; one restart is spent.
TEST_F(JobManagerTest, TwoLossesOfOneFaultCostOneRestart) {
  JobManagerOptions options = Options();
  options.recovery_settle = absl::Milliseconds(300);
  options.housekeeping = absl::Milliseconds(20);
  StartManager(options);
  for (const char* w : {"w0", "w1", "w2", "w3"}) AddWorker(w);
  const std::string id = Submit(JobYaml(2, 4, "recovery: {max_restarts: 1}\n"));
  AckAll({"w0", "w1"});
  ASSERT_EQ(Status(id).state(), v1::RUNNING);
  manager_->Disconnect("w0", &Sink("w0"), absl::UnavailableError("killed"));
  Sync();
  EXPECT_EQ(Status(id).state(), v1::RECOVERING);  // settling: not placed yet
  manager_->Disconnect("w1", &Sink("w1"), absl::UnavailableError("killed"));
  v1::JobStatus st;
  for (int i = 0; i < 200; ++i) {
    st = Status(id);
    if (st.state() == v1::CONFIGURING) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(st.state(), v1::CONFIGURING) << st.reason();
  ASSERT_EQ(st.attempts_size(), 2);
  EXPECT_THAT(st.attempts(1).workers(), ::testing::ElementsAre("w2", "w3"));
  EXPECT_EQ(st.attempts(0).cause(), v1::END_CAUSE_WORKER_LOST);
}

TEST_F(JobManagerTest, CancelPendingAndRunningJobs) {
  StartManager();
  AddWorker("w0");
  const std::string running = Submit(JobYaml(1, 4));
  AckAll({"w0"});
  const std::string pending = Submit(JobYaml(1, 4));
  ASSERT_EQ(Status(pending).state(), v1::PENDING);

  auto cancelled = manager_->Cancel(pending, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->reason(), "cancelled by the user");

  cancelled = manager_->Cancel(running, "changed my mind");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->reason(), "changed my mind");
  const auto stop = Sink("w0").Of(v1::Command::kStop);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_EQ(stop[0].stop().job_id(), running);
  EXPECT_EQ(stop[0].stop().reason(), "changed my mind");

  // Cancelling a finished job answers with its status; an unknown one is NOT_FOUND.
  auto again = manager_->Cancel(running, "twice");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->reason(), "changed my mind");
  EXPECT_EQ(manager_->Cancel("job-unknown", "").status().code(), absl::StatusCode::kNotFound);
}

// Found by the coordinator fuzz target: a reason that is not UTF-8 made the
// stored status unreadable (proto strings must be UTF-8), and ListJobs failed
// for everyone. Reasons are made valid before they are kept.
TEST_F(JobManagerTest, ReasonsThatAreNotUtf8AreKeptReadable) {
  StartManager();
  AddWorker("w0");
  const std::string cancelled = Submit(JobYaml(1, 4));
  ASSERT_TRUE(manager_->Cancel(cancelled, std::string("bye \xea\x00 \xff", 8)).ok());
  const std::string failed = Submit(JobYaml(1, 4));
  AckAll({"w0"});
  manager_->OnEvent(ErrorEvent("w0", failed, 0, "boom \xc3"));
  Sync();
  auto jobs = manager_->ListJobs(10);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ(Status(cancelled).reason(), std::string("bye ?\x00 ?", 8));
  EXPECT_EQ(Status(failed).state(), v1::FAILED);
  EXPECT_NE(Status(failed).reason().find("boom ?"), std::string::npos) << Status(failed).reason();
}

TEST_F(JobManagerTest, PhasesStartWhenEveryStageFinishedThePrevious) {
  StartManager();
  AddWorker("w0");
  AddWorker("w1");
  const std::string id =
      Submit(JobYaml(2, 0,
                     "phases:\n  - {name: local, steps: 2, algorithm: {name: nwise, n: 1}}\n"
                     "  - {name: finetune, steps: 2, algorithm: backprop}\n"));
  ASSERT_FALSE(id.empty());
  AckAll({"w0", "w1"});
  ASSERT_EQ(Status(id).state(), v1::RUNNING);
  EXPECT_EQ(Status(id).num_phases(), 2);
  EXPECT_EQ(Status(id).phase_name(), "local");

  manager_->OnEvent(PhaseDoneEvent("w0", id, 0, 0));
  Sync();
  EXPECT_EQ(Status(id).phase(), 0);
  EXPECT_EQ(Sink("w0").Of(v1::Command::kStart).size(), 1u);
  manager_->OnEvent(PhaseDoneEvent("w1", id, 1, 0));
  Sync();
  const v1::JobStatus st = Status(id);
  EXPECT_EQ(st.state(), v1::RUNNING);
  EXPECT_EQ(st.phase(), 1);
  EXPECT_EQ(st.phase_name(), "finetune");
  EXPECT_EQ(st.algorithm(), "backprop");
  for (const char* w : {"w0", "w1"}) {
    const auto start = Sink(w).Of(v1::Command::kStart);
    ASSERT_EQ(start.size(), 2u) << w;
    EXPECT_EQ(start[1].start().phase(), 1);
  }
  // Recorded before the stages were let go.
  auto stored = store_->GetJob(id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->status.phase(), 1);

  // A phase past the last one fails the job.
  manager_->OnEvent(PhaseDoneEvent("w0", id, 0, 1));
  manager_->OnEvent(PhaseDoneEvent("w1", id, 1, 1));
  Sync();
  EXPECT_EQ(Status(id).state(), v1::FAILED);
  EXPECT_THAT(Status(id).reason(), HasSubstr("only 2 phase(s)"));
}

TEST_F(JobManagerTest, WatchersGetTheCurrentStatusThenEveryChangeThenTheEnd) {
  StartManager();
  AddWorker("w0");
  const std::string first = Submit(JobYaml(1, 4));  // holds w0
  const std::string id = Submit(JobYaml(1, 4));
  std::vector<v1::JobEvent> events;  // appended on the subscriber's then the loop's thread
  absl::Mutex mu;
  auto sub = manager_->Subscribe(id, [&](const v1::JobEvent& e) {
    absl::MutexLock lock(&mu);
    events.push_back(e);
  });
  ASSERT_TRUE(sub.ok()) << sub.status();
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].status().state(), v1::PENDING);
  }
  ASSERT_TRUE(manager_->Cancel(first, "").ok());  // w0 is free: id is placed
  Sync();
  AckAll({"w0"});
  manager_->OnEvent(MetricsEvent("w0", id, 0, 2, 1.5));
  manager_->OnEvent(ResultEvent("w0", id, 0, 0.5));
  Sync();
  std::vector<v1::JobState> states;
  {
    absl::MutexLock lock(&mu);
    for (const v1::JobEvent& e : events) states.push_back(e.status().state());
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().status().state(), v1::SUCCEEDED);
  }
  EXPECT_THAT(states, ::testing::Contains(v1::CONFIGURING));
  EXPECT_THAT(states, ::testing::Contains(v1::RUNNING));
  EXPECT_EQ(std::count(states.begin(), states.end(), v1::SUCCEEDED), 1);
  EXPECT_TRUE(std::is_sorted(states.begin(), states.end()));  // the enum follows the lifecycle
  manager_->Unsubscribe(*sub);

  // Watching a finished job: its final status, at once.
  std::vector<v1::JobEvent> late;
  auto sub2 = manager_->Subscribe(id, [&](const v1::JobEvent& e) { late.push_back(e); });
  ASSERT_TRUE(sub2.ok());
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].status().state(), v1::SUCCEEDED);
  manager_->Unsubscribe(*sub2);
  EXPECT_EQ(manager_->Subscribe("job-unknown", [](const v1::JobEvent&) {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, RestartRecoversInterruptedJobsAndRequeuesPendingOnes) {
  StartManager();
  AddWorker("w0");
  const std::string running = Submit(JobYaml(1, 4));
  AckAll({"w0"});
  const std::string pending = Submit(JobYaml(1, 4));
  ASSERT_EQ(Status(running).state(), v1::RUNNING);
  ASSERT_EQ(Status(pending).state(), v1::PENDING);
  manager_.reset();  // the coordinator goes away; the store stays
  sinks_.clear();

  StartManager();
  v1::JobStatus st = Status(running);
  EXPECT_EQ(st.state(), v1::RECOVERING);
  EXPECT_EQ(st.reason(), "the coordinator restarted while the job was RUNNING");
  EXPECT_EQ(st.attempt(), 1);
  EXPECT_EQ(Status(pending).state(), v1::PENDING);
  // The recovering job goes before the one still waiting for its first run.
  AddWorker("w0");
  Sync();
  EXPECT_EQ(Status(running).state(), v1::CONFIGURING);
  EXPECT_EQ(Status(pending).state(), v1::PENDING);
  EXPECT_EQ(Sink("w0").Of(v1::Command::kConfigure).back().configure().attempt(), 1);
}

// Submitted suspended (an external queue owns admission): PENDING, outside
// the queue across a restart, until Release queues it; releasing twice, an
// unknown job or a job that was never suspended are errors.
TEST_F(JobManagerTest, ASuspendedJobWaitsOutsideTheQueueUntilReleased) {
  StartManager();
  AddWorker("w0");
  auto held = manager_->Submit(JobYaml(1, 4), "", /*suspended=*/true);
  ASSERT_TRUE(held.ok()) << held.status();
  Sync();
  v1::JobStatus st = Status(*held);
  EXPECT_EQ(st.state(), v1::PENDING);
  EXPECT_TRUE(st.suspended());
  EXPECT_THAT(st.reason(), HasSubstr("stagewise resume"));
  EXPECT_TRUE(Sink("w0").Of(v1::Command::kConfigure).empty());
  // A job submitted after it is placed on the idle worker.
  const std::string other = Submit(JobYaml(1, 4));
  EXPECT_EQ(Status(other).state(), v1::CONFIGURING);
  ASSERT_TRUE(manager_->Cancel(other, "").ok());
  auto never = manager_->Release(other);
  EXPECT_EQ(never.status().code(), absl::StatusCode::kFailedPrecondition) << never.status();
  EXPECT_THAT(never.status().message(), HasSubstr("CANCELLED"));
  EXPECT_EQ(manager_->Release("job-none").status().code(), absl::StatusCode::kNotFound);

  // A restart keeps it suspended.
  manager_.reset();
  sinks_.clear();
  StartManager();
  AddWorker("w0");
  Sync();
  EXPECT_TRUE(Status(*held).suspended());
  EXPECT_EQ(Status(*held).state(), v1::PENDING);
  EXPECT_TRUE(Sink("w0").Of(v1::Command::kConfigure).empty());

  auto released = manager_->Release(*held);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_FALSE(released->suspended());
  Sync();
  EXPECT_EQ(Status(*held).state(), v1::CONFIGURING);
  EXPECT_FALSE(Status(*held).suspended());
  ASSERT_EQ(Sink("w0").Of(v1::Command::kConfigure).size(), 1u);
  auto again = manager_->Release(*held);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("not suspended"));
  // Durable: the stored status says released.
  auto stored = store_->GetJob(*held);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_FALSE(stored->status.suspended());
}

// Shards reported by every stage commit a checkpoint (MANIFEST written);
// the next attempt resumes from it; events of the old attempt are ignored;
// recovery.max_restarts bounds the attempts.
TEST_F(JobManagerTest, CommitsCheckpointsAndResumesFromTheNewest) {
  const std::string root = ::testing::TempDir() + "jm_checkpoints_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  StartManager();
  AddWorker("w0");
  AddWorker("w1");
  const std::string id = Submit(JobYaml(
      2, 40,
      "checkpoint: {dir: " + root + ", every_steps: 10, keep: 2}\nrecovery: {max_restarts: 1}\n"));
  AckAll({"w0", "w1"});
  ASSERT_EQ(Status(id).state(), v1::RUNNING);
  auto saved = [&](const std::string& w, int stage, int64_t step, int attempt) {
    manager_->OnEvent(testing::SavedShard(root, id, w, stage, step, attempt));
  };

  saved("w0", 0, 10, 0);
  saved("w1", 1, 10, 0);
  saved("w0", 0, 20, 0);
  saved("w1", 1, 20, 0);
  saved("w0", 0, 30, 0);  // stage 1 never reports step 30: not committed
  Sync();
  EXPECT_EQ(Status(id).last_checkpoint_step(), 20);
  auto listed = manager_->ListCheckpoints(id);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->checkpoints_size(), 2);
  EXPECT_EQ(listed->checkpoints(0).step(), 20);
  EXPECT_EQ(listed->checkpoints(1).step(), 10);
  ASSERT_EQ(listed->skipped_size(), 1);
  EXPECT_THAT(listed->skipped(0), HasSubstr("not committed"));

  // A retryable stage error ends attempt 0; the next attempt resumes at 20.
  v1::WorkerEvent broke = ErrorEvent("w0", id, 0, "stage 0: the stream to stage 1 broke");
  broke.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  manager_->OnEvent(broke);
  Sync();
  v1::JobStatus st = Status(id);
  ASSERT_EQ(st.state(), v1::CONFIGURING) << st.reason();  // both workers were free again
  EXPECT_EQ(st.attempt(), 1);
  EXPECT_EQ(st.step(), 20);
  ASSERT_EQ(st.attempts_size(), 2);
  EXPECT_EQ(st.attempts(1).from_step(), 20);
  for (int j = 0; j < 2; ++j) {
    const std::string w = "w" + std::to_string(j);
    const v1::StageAssignment a = Sink(w).Of(v1::Command::kConfigure).back().configure();
    EXPECT_EQ(a.attempt(), 1);
    ASSERT_TRUE(a.has_resume()) << w;
    EXPECT_EQ(a.resume().step(), 20);
    EXPECT_EQ(a.resume().shard_path(),
              checkpoint::StepDir(root, id, 20) + "/" + checkpoint::ShardFileName(j));
  }
  // A late report of attempt 0 changes nothing.
  saved("w1", 1, 30, 0);
  Sync();
  EXPECT_EQ(Status(id).last_checkpoint_step(), 20);

  // A corrupt shard: that checkpoint is marked and never offered again.
  v1::WorkerEvent corrupt = ErrorEvent("w1", id, 1, "stage 1: checksum mismatch");
  corrupt.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
  corrupt.set_attempt(1);
  manager_->OnEvent(corrupt);
  Sync();
  st = Status(id);
  // The attempt never ran a step: it costs no restart (max_restarts: 1 was
  // spent on the broken stream), and the next one resumes from step 10.
  EXPECT_EQ(st.state(), v1::CONFIGURING) << st.reason();
  ASSERT_EQ(st.attempts_size(), 3);
  EXPECT_EQ(st.attempts(1).cause(), v1::END_CAUSE_CORRUPT_CHECKPOINT);
  EXPECT_THAT(st.attempts(1).end_reason(), HasSubstr("is corrupt"));
  EXPECT_EQ(st.attempts(2).from_step(), 10);
  listed = manager_->ListCheckpoints(id);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->checkpoints_size(), 1);
  EXPECT_EQ(listed->checkpoints(0).step(), 10);
  std::filesystem::remove_all(root);
}

TEST_F(JobManagerTest, ProfilingPlansThenConfiguresTheStages) {
  StartManager();
  AddWorker("w0");
  AddWorker("w1");
  const std::string yaml = JobYaml(0, 4, "").replace(JobYaml(0, 4, "").find("stages: 0"), 9,
                                                     "stages: {count: 2, partition: auto}");
  const std::string id = Submit(yaml);
  ASSERT_EQ(Status(id).state(), v1::PROFILING);
  const auto profile = Sink("w0").Of(v1::Command::kProfile);
  ASSERT_EQ(profile.size(), 1u);
  EXPECT_EQ(profile[0].profile().job_id(), id);
  EXPECT_EQ(profile[0].profile().job_spec_yaml(), yaml);
  EXPECT_TRUE(Sink("w1").commands().empty());

  ProfileEqualBlocks(*manager_, "w0", id, yaml);
  Sync();
  const v1::JobStatus st = Status(id);
  ASSERT_EQ(st.state(), v1::CONFIGURING) << st.reason();
  const auto& summary = st.summary();
  auto blocks = models::PlanModel(ParseJobSpec(yaml)->model);
  ASSERT_TRUE(blocks.ok());
  ASSERT_TRUE(summary.count("plan.stage1.block_begin"));
  EXPECT_EQ(summary.at("plan.profile_cached"), 0);
  const auto c0 = Sink("w0").Of(v1::Command::kConfigure);
  const auto c1 = Sink("w1").Of(v1::Command::kConfigure);
  ASSERT_EQ(c0.size(), 1u);
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c0[0].configure().block_begin(), 0);
  EXPECT_EQ(c0[0].configure().block_end(), summary.at("plan.stage0.block_end"));
  EXPECT_EQ(c1[0].configure().block_begin(), summary.at("plan.stage1.block_begin"));
  EXPECT_EQ(c1[0].configure().block_end(), static_cast<int>(blocks->size()));
  EXPECT_THAT(Transitions(id), ElementsAre(v1::PROFILING, v1::CONFIGURING));
}

// transport's compression: auto is planned: the job profiles first (its
// partition is fixed), and each stage's assignment carries the formats the
// plan chose for what it sends; a direction the job fixes is left alone.
TEST_F(JobManagerTest, CompressionAutoIsPlannedAndEachStageGetsItsFormats) {
  StartManager();
  AddWorker("w0");
  AddWorker("w1");
  // 1 KiB messages over a link of 8 kbit/s: 1 s per message, which no format
  // brings under a stage's compute (tens of ms): int4, the smallest.
  const std::string yaml =
      JobYaml(2, 4, "placement: {link_gbps: 0.000008}\ntransport: {compression: auto}\n");
  const std::string id = Submit(yaml);
  ASSERT_EQ(Status(id).state(), v1::PROFILING) << Status(id).reason();
  ProfileEqualBlocks(*manager_, "w0", id, yaml);
  Sync();
  ASSERT_EQ(Status(id).state(), v1::CONFIGURING) << Status(id).reason();
  const v1::StageAssignment a0 = Sink("w0").Of(v1::Command::kConfigure).at(0).configure();
  const v1::StageAssignment a1 = Sink("w1").Of(v1::Command::kConfigure).at(0).configure();
  EXPECT_EQ(a0.forward_compression(), v1::COMPRESSION_INT4);
  EXPECT_EQ(a0.backward_compression(), v1::COMPRESSION_NONE);  // the first stage sends none back
  EXPECT_EQ(a1.backward_compression(), v1::COMPRESSION_INT4);
  EXPECT_EQ(a1.forward_compression(), v1::COMPRESSION_NONE);  // nor the last forward

  // A fast link: plain float32 fits under the compute.
  AddWorker("w2");
  AddWorker("w3");
  const std::string fast_yaml =
      JobYaml(2, 4, "placement: {link_gbps: 100}\ntransport: {compression: auto}\n");
  const std::string fast = Submit(fast_yaml);
  ProfileEqualBlocks(*manager_, "w2", fast, fast_yaml);
  Sync();
  ASSERT_EQ(Status(fast).state(), v1::CONFIGURING) << Status(fast).reason();
  EXPECT_EQ(Sink("w2").Of(v1::Command::kConfigure).at(0).configure().forward_compression(),
            v1::COMPRESSION_NONE);
}

// delayed's max_in_flight: auto on links with latency is planned: the job
// profiles first (its partition is fixed) and each stage's assignment carries
// the depth the plan chose to cover the round trip, at least the natural one
// and decreasing along the pipeline; the plan's depths are in the summary.
// On links without latency the job needs no plan and carries none.
TEST_F(JobManagerTest, MaxInFlightAutoIsPlannedAndEachStageGetsItsDepth) {
  StartManager();
  for (const char* w : {"w0", "w1", "w2"}) AddWorker(w);
  // A 1 s round trip against stages of milliseconds: far more than 2J - 1.
  const std::string yaml = JobYaml(
      3, 4, "algorithm: {name: delayed, max_in_flight: auto}\nplacement: {link_rtt_ms: 1000}\n");
  const std::string id = Submit(yaml);
  ASSERT_EQ(Status(id).state(), v1::PROFILING) << Status(id).reason();
  ProfileEqualBlocks(*manager_, "w0", id, yaml);
  Sync();
  const v1::JobStatus st = Status(id);
  ASSERT_EQ(st.state(), v1::CONFIGURING) << st.reason();
  std::vector<int> depth(3, -1);
  for (const char* w : {"w0", "w1", "w2"}) {
    const v1::StageAssignment a = Sink(w).Of(v1::Command::kConfigure).at(0).configure();
    depth.at(a.stage()) = a.max_in_flight();
  }
  EXPECT_GT(depth[0], 5);  // more than the natural 2(J-1)+1
  EXPECT_GE(depth[0], depth[1] + 2);
  EXPECT_EQ(depth[2], 1);  // the last stage has nothing in flight
  EXPECT_EQ(st.summary().at("plan.stage0.in_flight"), depth[0]);
  EXPECT_EQ(st.summary().at("plan.stage1.in_flight"), depth[1]);

  // No latency: nothing to cover, no profile, no depth.
  for (const char* w : {"w3", "w4", "w5"}) AddWorker(w);
  const std::string flat =
      Submit(JobYaml(3, 4, "algorithm: {name: delayed, max_in_flight: auto}\n"));
  ASSERT_EQ(Status(flat).state(), v1::CONFIGURING) << Status(flat).reason();
  for (const char* w : {"w3", "w4", "w5"}) {
    EXPECT_EQ(Sink(w).Of(v1::Command::kConfigure).at(0).configure().max_in_flight(), 0);
  }
}

TEST_F(JobManagerTest, BadProfileFailsTheJob) {
  StartManager();
  AddWorker("w0");
  const std::string yaml = JobYaml(0, 4, "").replace(JobYaml(0, 4, "").find("stages: 0"), 9,
                                                     "stages: {count: 1, partition: auto}");
  const std::string id = Submit(yaml);
  ASSERT_EQ(Status(id).state(), v1::PROFILING);
  manager_->OnEvent(ProfileEvent("w0", id));  // no blocks, batch size 0
  Sync();
  EXPECT_EQ(Status(id).state(), v1::FAILED);
  EXPECT_THAT(Status(id).reason(), HasSubstr("profile from the worker"));
}

TEST_F(JobManagerTest, FinishedJobsLeaveTheMetricsAfterTheirTtl) {
  JobManagerOptions options = Options();
  options.finished_job_metrics_ttl = absl::ZeroDuration();
  StartManager(options);
  AddWorker("w0");
  const std::string id = Submit(JobYaml(1, 4));
  AckAll({"w0"});
  manager_->OnEvent(MetricsEvent("w0", id, 0, 2, 1.5));
  Sync();
  ASSERT_TRUE(Gauge("stagewise_job_step", id).ok());
  ASSERT_TRUE(manager_->Cancel(id, "").ok());
  EXPECT_EQ(Gauge("stagewise_job_step", id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Gauge("stagewise_job_train_loss", id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, FinishedJobsKeepTheirMetricsWithinTheTtl) {
  StartManager();  // default TTL: minutes
  AddWorker("w0");
  const std::string id = Submit(JobYaml(1, 4));
  AckAll({"w0"});
  manager_->OnEvent(MetricsEvent("w0", id, 0, 2, 1.5));
  ASSERT_TRUE(manager_->Cancel(id, "").ok());
  auto step = Gauge("stagewise_job_step", id);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
}

TEST_F(JobManagerTest, RefusesBadInput) {
  StartManager();
  v1::WorkerInfo no_address = Info("w0");
  no_address.clear_address();
  EXPECT_EQ(manager_->Register(no_address).status().code(), absl::StatusCode::kInvalidArgument);
  FakeSink sink;
  EXPECT_EQ(manager_->Connect("nobody", "", &sink).code(), absl::StatusCode::kNotFound);
  auto bad = manager_->Submit(JobYaml(2, 4, "optimiser: {lr: 1}\n"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("optimiser"));
  auto jobs = manager_->ListJobs(0);
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
}

}  // namespace
}  // namespace stagewise::coordinator
