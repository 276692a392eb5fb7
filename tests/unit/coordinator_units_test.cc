// The units JobManager wires together, each on its own with fakes: event
// admission (a pure function of the event and the job), recovery and
// checkpoint commits (through a FakeJobHost), the status view.
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>

#include "coordinator/checkpoint_commit.h"
#include "coordinator/event_admission.h"
#include "coordinator/job_recovery.h"
#include "coordinator/job_view.h"
#include "coordinator/planned_stop.h"
#include "coordinator/rebalancer.h"
#include "coordinator/scheduler.h"
#include "services/checkpoint/checkpoint.h"
#include "services/metrics/metrics.h"
#include "tests/unit/coordinator_fakes.h"
#include "tests/unit/fake_job_host.h"

namespace stagewise::coordinator {
namespace {

using testing::ErrorEvent;
using testing::FakeJobHost;
using ::testing::HasSubstr;
using testing::JobYaml;
using testing::MetricsEvent;
using ::testing::StartsWith;
using Verdict = Admission::Verdict;

// A RUNNING two-stage job on w0 and w1, attempt 1 (attempt 0 ran on w2, w3).
LiveJob RunningJob(const std::string& extra_yaml = "") {
  auto spec = ParseJobSpec(JobYaml(2, 40, extra_yaml));
  EXPECT_TRUE(spec.ok()) << spec.status();
  LiveJob job;
  job.spec = *spec;
  job.status.set_job_id("job-1");
  job.status.set_state(v1::RUNNING);
  job.status.set_total_steps(40);
  job.status.set_num_phases(1);
  job.status.set_attempt(1);
  job.attempt_number = 1;
  job.attempt.workers = {"w0", "w1"};
  job.cut.ranges = {{0, 2}, {2, 4}};
  v1::JobAttempt* old = job.status.add_attempts();
  old->set_attempt(0);
  old->add_workers("w2");
  old->add_workers("w3");
  old->set_ended_unix_ms(1);
  v1::JobAttempt* now = job.status.add_attempts();
  now->set_attempt(1);
  now->add_workers("w0");
  now->add_workers("w1");
  return job;
}

v1::WorkerEvent WithAttempt(v1::WorkerEvent e, int attempt) {
  e.set_attempt(attempt);
  return e;
}

// A cut moved onto other ranges keeps each block's mode and the job's
// schedule, and drops what the plan chose for the old stages.
TEST(CutTest, RecutKeepsEachBlocksModeAndDropsTheOldStagesChoices) {
  const BlockMode S = BlockMode::kStore, R = BlockMode::kRebuild;
  Cut cut{
      .ranges = {{0, 2}, {2, 5}},
      .modes = {{R, S}, {S, R, R}},
      .schedule = PipelineSchedule::kZbH1,
      .wire = {{Compression::kBf16, Compression::kNone}, {Compression::kNone, Compression::kInt8}},
      .max_in_flight = {5, 1}};
  const Cut moved = cut.Recut({{0, 3}, {3, 4}, {4, 5}});
  EXPECT_EQ(moved.num_stages(), 3);
  EXPECT_EQ(moved.modes, (std::vector<std::vector<BlockMode>>{{R, S, S}, {R}, {R}}));
  EXPECT_EQ(moved.schedule, PipelineSchedule::kZbH1);
  EXPECT_TRUE(moved.wire.empty());
  EXPECT_TRUE(moved.max_in_flight.empty());
  EXPECT_EQ(moved.Text(), "[0,3) [3,4) [4,5)");
  EXPECT_FALSE(moved == cut);
  EXPECT_TRUE(cut.Recut(cut.ranges).modes == cut.modes);
  // No modes stay no modes (every block's default).
  cut.modes.clear();
  EXPECT_TRUE(cut.Recut({{0, 5}}).modes.empty());
}

TEST(EventAdmission, TakesTheCurrentAttemptsEventsFromTheStagesOwnWorker) {
  const LiveJob job = RunningJob();
  EXPECT_EQ(AdmitEvent(WithAttempt(MetricsEvent("w1", "job-1", 1, 5, 0.5), 1), &job).verdict,
            Verdict::kTake);
  EXPECT_EQ(AdmitEvent(testing::AckEvent("w9", 3), nullptr).verdict, Verdict::kTake);
  // Any stage reports its step and samples; the last one its evaluation too,
  // and a diverged (non-finite) loss is dropped later, not refused here.
  v1::WorkerEvent samples = WithAttempt(MetricsEvent("w0", "job-1", 0, 5, 0.5), 1);
  samples.mutable_metrics()->mutable_values()->clear();
  (*samples.mutable_metrics()->mutable_values())["samples"] = 16;
  EXPECT_EQ(AdmitEvent(samples, &job).verdict, Verdict::kTake);
  v1::WorkerEvent eval = WithAttempt(MetricsEvent("w1", "job-1", 1, 5, 0.5), 1);
  (*eval.mutable_metrics()->mutable_values())["eval_accuracy"] = 1;
  (*eval.mutable_metrics()->mutable_values())["eval_loss"] = 0;
  EXPECT_EQ(AdmitEvent(eval, &job).verdict, Verdict::kTake);
  v1::WorkerEvent diverged =
      WithAttempt(MetricsEvent("w1", "job-1", 1, 5, std::numeric_limits<double>::infinity()), 1);
  EXPECT_EQ(AdmitEvent(diverged, &job).verdict, Verdict::kTake);
}

TEST(EventAdmission, RefusesWithTheMetricLabel) {
  const LiveJob job = RunningJob();
  struct Case {
    const char* what;
    v1::WorkerEvent event;
    const char* label;
  };
  v1::WorkerEvent far_step = WithAttempt(MetricsEvent("w1", "job-1", 1, 41, 0.5), 1);
  v1::WorkerEvent too_many = WithAttempt(MetricsEvent("w1", "job-1", 1, 5, 0.5), 1);
  for (int i = 0; i < 65; ++i)
    (*too_many.mutable_metrics()->mutable_values())[std::to_string(i)] = 1;
  v1::WorkerEvent phase = WithAttempt(testing::PhaseDoneEvent("w0", "job-1", 0, 3), 1);
  v1::WorkerEvent trace = WithAttempt(MetricsEvent("w0", "job-1", 0, 1, 0), 1);
  trace.mutable_trace()->set_dropped(1);
  v1::WorkerEvent bytes = WithAttempt(MetricsEvent("w0", "job-1", 0, 1, 0), 1);
  bytes.mutable_checkpoint_saved()->set_bytes(-1);
  // Evaluation numbers and the training loss belong to the last stage, and to
  // their domains.
  auto eval = [](const std::string& worker, int stage, const char* key, double value) {
    v1::WorkerEvent e = WithAttempt(MetricsEvent(worker, "job-1", stage, 5, 0.5), 1);
    e.mutable_metrics()->mutable_values()->clear();
    (*e.mutable_metrics()->mutable_values())[key] = value;
    return e;
  };
  const Case cases[] = {
      {"old attempt, other worker", WithAttempt(MetricsEvent("w0", "job-1", 0, 5, 0.5), 0),
       "stale_attempt"},
      {"not a member", WithAttempt(MetricsEvent("w7", "job-1", 1, 5, 0.5), 1), "not_assigned"},
      {"another stage's worker", WithAttempt(MetricsEvent("w0", "job-1", 1, 5, 0.5), 1),
       "not_assigned"},
      {"stage out of range", WithAttempt(MetricsEvent("w0", "job-1", 9, 5, 0.5), 1),
       "not_assigned"},
      {"profile while running", testing::ProfileEvent("w0", "job-1"), "not_assigned"},
      {"step past the end", far_step, "out_of_range"},
      {"too many values", too_many, "out_of_range"},
      {"not the current phase", phase, "out_of_range"},
      {"the job does not trace", trace, "out_of_range"},
      {"negative shard size", bytes, "out_of_range"},
      {"accuracy from stage 0", eval("w0", 0, "eval_accuracy", 0.999), "wrong_stage"},
      {"eval loss from stage 0", eval("w0", 0, "eval_loss", 0.01), "wrong_stage"},
      {"training loss from stage 0", eval("w0", 0, "train_loss", 0.01), "wrong_stage"},
      {"accuracy above 1", eval("w1", 1, "eval_accuracy", 1e308), "out_of_range"},
      {"negative accuracy", eval("w1", 1, "eval_accuracy", -0.5), "out_of_range"},
      {"negative loss", eval("w1", 1, "train_loss", -1), "out_of_range"},
      {"negative samples", eval("w0", 0, "samples", -1), "out_of_range"},
  };
  for (const Case& c : cases) {
    const Admission a = AdmitEvent(c.event, &job);
    EXPECT_EQ(a.verdict, Verdict::kRefuse) << c.what;
    EXPECT_EQ(a.label, c.label) << c.what << ": " << a.why;
    EXPECT_FALSE(a.why.empty()) << c.what;
  }
  const Admission unknown = AdmitEvent(MetricsEvent("w0", "job-2", 0, 1, 0), nullptr);
  EXPECT_EQ(unknown.label, "unknown_job");
  EXPECT_TRUE(unknown.quiet());
}

// A stage's PhaseDone counts once per phase: a repeat is refused (it must
// not pass for progress with the stall watchdog), another stage's is taken.
TEST(EventAdmission, ARepeatedPhaseDoneIsRefused) {
  LiveJob job = RunningJob();
  const v1::WorkerEvent first = WithAttempt(testing::PhaseDoneEvent("w0", "job-1", 0, 0), 1);
  EXPECT_EQ(AdmitEvent(first, &job).verdict, Verdict::kTake);
  job.attempt.phase_done[0].insert(SlotOf(job, 0, 0));
  const Admission again = AdmitEvent(first, &job);
  EXPECT_EQ(again.verdict, Verdict::kRefuse);
  EXPECT_EQ(again.label, "repeated") << again.why;
  EXPECT_THAT(again.why, HasSubstr("already finished phase 0"));
  EXPECT_EQ(AdmitEvent(WithAttempt(testing::PhaseDoneEvent("w1", "job-1", 1, 0), 1), &job).verdict,
            Verdict::kTake);
}

TEST(EventAdmission, AnEndedAttemptsRootCauseFailsTheJob) {
  LiveJob job = RunningJob();
  job.status.set_state(v1::RECOVERING);
  // Attempt 0's stage 1 ran on w3: its deterministic error is the root cause.
  v1::WorkerEvent error = WithAttempt(ErrorEvent("w3", "job-1", 1, "stage 1: NaN loss"), 0);
  Admission a = AdmitEvent(error, &job);
  EXPECT_EQ(a.verdict, Verdict::kFailJob);
  EXPECT_EQ(a.why, "stage 1: NaN loss");
  // A transient one, or a cancellation, is dropped without a count.
  error.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(AdmitEvent(error, &job).verdict, Verdict::kDropStale);
  error.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(AdmitEvent(error, &job).verdict, Verdict::kDropStale);
  // Not from the worker that ran that stage: refused.
  error.set_worker_id("w2");
  EXPECT_EQ(AdmitEvent(error, &job).label, "stale_attempt");
  // While the job runs again, the old error no longer fails it...
  job.status.set_state(v1::RUNNING);
  error.set_worker_id("w3");
  error.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInternal));
  v1::JobAttempt* ended = job.status.mutable_attempts(0);
  ASSERT_EQ(ended->attempt(), 0);
  EXPECT_EQ(AdmitEvent(error, &job).verdict, Verdict::kDropStale);
  // ...unless attempt 0 ended only on a neighbour's broken stream: this is
  // the cause that came after its consequence (a diverged loss is not retried
  // however late its report).
  ended->set_end_reason_secondary(true);
  EXPECT_EQ(AdmitEvent(error, &job).verdict, Verdict::kFailJob);
}

TEST(EventAdmission, ErrorsOfNoStageComeFromAnyMember) {
  const LiveJob job = RunningJob();
  v1::WorkerEvent e = ErrorEvent("w1", "job-1", -1, "profiling failed");
  e.set_attempt(7);  // errors of no stage belong to no attempt
  EXPECT_EQ(EventAttempt(e), -1);
  EXPECT_EQ(AdmitEvent(e, &job).verdict, Verdict::kTake);
  e.set_worker_id("w9");
  EXPECT_EQ(AdmitEvent(e, &job).label, "not_assigned");
}

TEST(EventAdmission, RetryableAndNonFiniteValues) {
  v1::StageError e;
  e.set_code(static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_FALSE(IsRetryable(e));
  e.set_retryable(true);
  EXPECT_TRUE(IsRetryable(e));
  e.set_retryable(false);
  for (absl::StatusCode code : {absl::StatusCode::kUnavailable, absl::StatusCode::kAborted,
                                absl::StatusCode::kDeadlineExceeded}) {
    e.set_code(static_cast<int>(code));
    EXPECT_TRUE(IsRetryable(e)) << code;
  }
  v1::MetricsReport m;
  (*m.mutable_values())["train_loss"] = std::numeric_limits<double>::quiet_NaN();
  (*m.mutable_values())["samples"] = 16;
  const v1::MetricsReport clean = WithoutNonFinite(m);
  EXPECT_EQ(clean.values().size(), 1u);
  EXPECT_EQ(clean.values().count("samples"), 1u);
}

TEST(LiveJob, MetricsMoveTheStatusOnlyFromTheRightStage) {
  LiveJob job = RunningJob();
  job.attempt.started = absl::Now() - absl::Seconds(2);
  v1::MetricsReport m;
  m.set_step(8);
  (*m.mutable_values())["train_loss"] = 0.5;
  // Stage 0's training loss is its own business: nothing moves.
  EXPECT_TRUE(ApplyMetrics(job, 0, m, absl::Now()).empty());
  EXPECT_EQ(job.status.step(), 0);
  const std::vector<MetricPoint> points = ApplyMetrics(job, 1, m, absl::Now());
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].name, "train_loss");
  EXPECT_EQ(job.status.step(), 8);
  EXPECT_EQ(job.max_step, 8);
  EXPECT_EQ(job.status.attempts(1).reached_step(), 8);
  EXPECT_EQ(job.status.epoch(), 4);  // 2 steps per epoch
  EXPECT_GT(job.status.samples_per_second(), 0);
  v1::MetricsReport eval;
  eval.set_step(8);
  (*eval.mutable_values())["eval_accuracy"] = 0.75;
  EXPECT_TRUE(ApplyMetrics(job, 0, eval, absl::Now()).empty());  // the head evaluates
  EXPECT_EQ(ApplyMetrics(job, 1, eval, absl::Now()).size(), 2u);
  EXPECT_DOUBLE_EQ(job.status.eval_accuracy(), 0.75);
  v1::StageResult result;
  (*result.mutable_values())["steps"] = 40;
  EXPECT_EQ(ApplyResult(job, 1, result, absl::Now()).size(), 1u);
  EXPECT_EQ(job.status.summary().at("stage1.steps"), 40);
}

class JobRecoveryTest : public ::testing::Test {
 protected:
  JobRecoveryTest() : metrics_(registry_), recovery_(&host_, &metrics_, absl::Seconds(30)) {}
  prometheus::Registry registry_;
  metrics::CoordinatorMetrics metrics_;
  FakeJobHost host_;
  JobRecovery recovery_;
};

TEST_F(JobRecoveryTest, ALostWorkerEndsTheAttemptAndQueuesTheNext) {
  host_.jobs["job-1"] = RunningJob("recovery: {max_restarts: 3}\n");
  recovery_.Recover("job-1", "lost worker w1", v1::END_CAUSE_WORKER_LOST);
  ASSERT_EQ(host_.stopped.size(), 1u);
  EXPECT_THAT(host_.stopped[0].second, HasSubstr("attempt 1 ended: lost worker w1"));
  const LiveJob& job = host_.jobs.at("job-1");
  EXPECT_EQ(job.attempt_number, 2);
  EXPECT_EQ(job.status.attempt(), 2);
  EXPECT_TRUE(job.attempt.workers.empty());
  EXPECT_EQ(job.status.state(), v1::RECOVERING);
  EXPECT_EQ(job.status.attempts(1).end_reason(), "lost worker w1");
  ASSERT_EQ(host_.requeued.size(), 1u);
  EXPECT_TRUE(host_.requeued[0].second);
  EXPECT_THAT(host_.progress.back(), HasSubstr("will start from step 0"));
  EXPECT_LT(job.recovery_deadline, absl::InfiniteFuture());
  // A second loss while it waits only names the cause better.
  recovery_.Recover("job-1", "lost worker w0", v1::END_CAUSE_WORKER_LOST);
  EXPECT_EQ(host_.requeued.size(), 1u);
  EXPECT_EQ(host_.jobs.at("job-1").status.attempts(1).end_reason(), "lost worker w0");
}

// A stage whose neighbour's stream broke reports first; the neighbour's own
// error, arriving once the attempt has ended, names the end; another echo or
// an error of another attempt changes nothing.
TEST_F(JobRecoveryTest, TheCauseReplacesABrokenStreamThatWasReportedFirst) {
  host_.jobs["job-1"] = RunningJob("recovery: {max_restarts: 3}\n");
  LiveJob& job = host_.jobs.at("job-1");
  v1::StageError echo;
  echo.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  echo.set_retryable(true);
  echo.set_neighbour_stream(true);
  echo.set_message("stage 1: the stream from stage 0 broke: cancelled");
  recovery_.OnStageError("job-1", job, 1, echo);
  ASSERT_EQ(job.attempt_number, 2);
  EXPECT_TRUE(job.status.attempts(1).end_reason_secondary());
  recovery_.NoteLateError(job, 1, echo);  // another echo: still the first
  EXPECT_EQ(job.status.attempts(1).end_reason(), echo.message());
  v1::StageError cause;
  cause.set_code(static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  cause.set_retryable(true);
  cause.set_message("stage 0: an all-reduce among 2 replicas failed (timeout 3 s)");
  recovery_.NoteLateError(job, 0, cause);  // not that attempt
  EXPECT_EQ(job.status.attempts(1).end_reason(), echo.message());
  recovery_.NoteLateError(job, 1, cause);
  EXPECT_EQ(job.status.attempts(1).end_reason(),
            absl::StrCat(cause.message(), " (first reported: ", echo.message(), ")"));
  EXPECT_FALSE(job.status.attempts(1).end_reason_secondary());
  EXPECT_EQ(job.status.attempts(1).cause(), v1::END_CAUSE_STAGE_ERROR);
  v1::StageError later = cause;
  later.set_message("stage 1: something else");
  recovery_.NoteLateError(job, 1, later);  // the cause is named once
  EXPECT_THAT(job.status.attempts(1).end_reason(), HasSubstr("timeout 3 s"));
  // A first report that is not an echo is never replaced.
  host_.jobs["job-2"] = RunningJob("recovery: {max_restarts: 3}\n");
  LiveJob& other = host_.jobs.at("job-2");
  recovery_.OnStageError("job-2", other, 0, cause);
  EXPECT_FALSE(other.status.attempts(1).end_reason_secondary());
  recovery_.NoteLateError(other, 1, later);
  EXPECT_EQ(other.status.attempts(1).end_reason(), cause.message());
}

TEST_F(JobRecoveryTest, GivesUpAfterMaxRestarts) {
  host_.jobs["job-1"] = RunningJob("recovery: {max_restarts: 1}\n");
  recovery_.Recover("job-1", "the stream broke", v1::END_CAUSE_STAGE_ERROR);
  ASSERT_EQ(host_.ended.size(), 1u);
  EXPECT_EQ(host_.ended[0].state, v1::FAILED);
  EXPECT_THAT(host_.ended[0].reason, HasSubstr("gave up after 2 attempt(s)"));
  EXPECT_TRUE(host_.requeued.empty());
}

TEST_F(JobRecoveryTest, WithoutACheckpointOrFromScratchTheJobFails) {
  host_.jobs["job-1"] = RunningJob("recovery: {from_scratch: false}\n");
  recovery_.Recover("job-1", "lost worker w1", v1::END_CAUSE_WORKER_LOST);
  ASSERT_EQ(host_.ended.size(), 1u);
  EXPECT_THAT(host_.ended[0].reason, HasSubstr("recovery.from_scratch is false"));
}

TEST_F(JobRecoveryTest, AProfilingJobGoesBackToTheQueue) {
  LiveJob job = RunningJob();
  job.status.set_state(v1::PROFILING);
  host_.jobs["job-1"] = job;
  recovery_.Recover("job-1", "lost worker w0", v1::END_CAUSE_WORKER_LOST);
  ASSERT_EQ(host_.requeued.size(), 1u);
  EXPECT_FALSE(host_.requeued[0].second);
  EXPECT_EQ(host_.jobs.at("job-1").status.state(), v1::PENDING);
  EXPECT_EQ(host_.jobs.at("job-1").attempt_number, 1);  // no attempt was spent
}

TEST_F(JobRecoveryTest, DeadlinesFailWaitingJobsAndRecoverSilentStages) {
  LiveJob waiting = RunningJob();
  waiting.status.set_state(v1::RECOVERING);
  waiting.recovery_deadline = absl::Now() - absl::Seconds(1);
  host_.jobs["job-1"] = waiting;
  LiveJob configuring = RunningJob("recovery: {max_restarts: 5}\n");
  configuring.status.set_job_id("job-2");
  configuring.status.set_state(v1::CONFIGURING);
  configuring.attempt.configure_deadline = absl::Now() - absl::Seconds(1);
  configuring.attempt.pending_acks = {{7, "w1"}};
  host_.jobs["job-2"] = configuring;
  recovery_.CheckDeadlines(absl::Now());
  ASSERT_EQ(host_.ended.size(), 1u);
  EXPECT_EQ(host_.ended[0].job_id, "job-1");
  EXPECT_THAT(host_.ended[0].reason, HasSubstr("idle workers within recovery.wait_seconds"));
  EXPECT_EQ(host_.jobs.at("job-2").status.state(), v1::RECOVERING);
  EXPECT_THAT(host_.jobs.at("job-2").status.attempts(1).end_reason(),
              HasSubstr("did not acknowledge their assignment within 30s (no answer from w1)"));
}

TEST_F(JobRecoveryTest, PastItsWaitARecoveryWithMinStagesTakesFewerStagesOnce) {
  LiveJob waiting = RunningJob("recovery: {min_stages: 1}\n");
  waiting.status.set_state(v1::RECOVERING);
  waiting.recovery_deadline = absl::Now() - absl::Seconds(1);
  host_.jobs["job-1"] = waiting;
  EXPECT_TRUE(FewerStageCounts(waiting).empty());  // not before its wait
  recovery_.CheckDeadlines(absl::Now());
  EXPECT_TRUE(host_.ended.empty());
  LiveJob& job = host_.jobs.at("job-1");
  EXPECT_TRUE(job.fewer_stages);
  EXPECT_THAT(FewerStageCounts(job), ::testing::ElementsAre(1));
  ASSERT_EQ(host_.requeued.size(), 1u);
  EXPECT_THAT(host_.progress.back(), HasSubstr("resumes on as few as 1 stages"));
  EXPECT_GT(job.recovery_deadline, absl::Now());
  // Still nothing idle after the second wait: the job fails, saying so.
  job.recovery_deadline = absl::Now() - absl::Seconds(1);
  recovery_.CheckDeadlines(absl::Now());
  ASSERT_EQ(host_.ended.size(), 1u);
  EXPECT_THAT(host_.ended[0].reason, HasSubstr("(recovery.min_stages: 1)"));
}

TEST(LiveJob, AnAttemptOnFewerStagesIsCutAnewAndLoadsEveryOverlappingShard) {
  LiveJob job = RunningJob("recovery: {min_stages: 1}\n");
  job.fewer_stages = true;
  checkpoint::Committed c;
  c.dir = "/ckpt/job-1/step-0000000020";
  c.manifest.set_step(20);
  c.manifest.set_phase_step(20);
  for (int j = 0; j < 2; ++j) {
    v1::CheckpointShard* shard = c.manifest.add_shards();
    shard->set_stage(j);
    shard->set_file(checkpoint::ShardFileName(j));
    shard->set_block_begin(2 * j);
    shard->set_block_end(2 * j + 2);
    shard->set_bytes(100 + j);
  }
  job.resume = c;
  auto said = CutFewerStages(job, 1);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_THAT(*said, HasSubstr("this attempt runs 1 of 2 stages"));
  EXPECT_THAT(*said, HasSubstr("the checkpoint at step 20 resharded"));
  ASSERT_EQ(job.cut.ranges.size(), 1u);
  EXPECT_EQ(job.cut.ranges[0], std::make_pair(0, 4));
  EXPECT_EQ(job.status.num_stages(), 1);
  EXPECT_FALSE(job.fewer_stages);

  prometheus::Registry registry;
  metrics::CoordinatorMetrics metrics(registry);
  FakeJobHost host;
  JobRecovery recovery(&host, &metrics, absl::Seconds(30));
  std::vector<v1::Command> commands(1);
  recovery.BeginAttempt(job, &commands);
  const v1::ResumePoint& r = commands[0].configure().resume();
  EXPECT_EQ(r.step(), 20);
  EXPECT_TRUE(r.shard_path().empty());
  ASSERT_EQ(r.sources_size(), 2);
  EXPECT_EQ(r.sources(1).path(), c.dir + "/stage-1.pt");
  EXPECT_EQ(r.sources(1).bytes(), 101);
  EXPECT_EQ(r.sources(1).block_begin(), 2);
  EXPECT_EQ(r.sources(1).block_end(), 4);
}

TEST_F(JobRecoveryTest, APlannedStopCheckpointsFirstAndIsNoRestart) {
  // Attempt 0 ended early already: with max_restarts 1, counting this stop
  // as a restart would fail the job.
  host_.jobs["job-1"] = RunningJob(
      "checkpoint: {dir: /tmp/never-written, every_steps: 1000}\nrecovery: {max_restarts: 1}\n");
  LiveJob& job = host_.jobs.at("job-1");
  PlannedStops planned(&host_, &recovery_);
  ASSERT_TRUE(planned.Begin("job-1", job, "worker w1 is being preempted", v1::END_CAUSE_PREEMPTED));
  EXPECT_FALSE(planned.Begin("job-1", job, "again", v1::END_CAUSE_PREEMPTED));  // one at a time
  ASSERT_EQ(host_.sent.size(), 1u);
  EXPECT_EQ(host_.sent[0].first, "w0");  // stage 0
  EXPECT_EQ(host_.sent[0].second.checkpoint_soon().job_id(), "job-1");
  EXPECT_EQ(host_.sent[0].second.checkpoint_soon().attempt(), 1);
  // Stage 0 picks step 17; an older checkpoint's commit changes nothing.
  planned.OnPlanned(job, 17);
  job.status.set_last_checkpoint_step(10);
  planned.OnCommitted("job-1", job);
  EXPECT_TRUE(host_.stopped.empty());
  job.status.set_last_checkpoint_step(17);
  planned.OnCommitted("job-1", job);
  ASSERT_EQ(host_.stopped.size(), 1u);
  EXPECT_TRUE(host_.ended.empty()) << host_.ended[0].reason;
  const LiveJob& after = host_.jobs.at("job-1");
  EXPECT_EQ(after.status.state(), v1::RECOVERING);
  EXPECT_EQ(after.status.attempts(1).cause(), v1::END_CAUSE_PREEMPTED);
  EXPECT_THAT(after.status.attempts(1).end_reason(),
              HasSubstr("worker w1 is being preempted (checkpoint at step 17 committed; "));
  EXPECT_FALSE(after.attempt.planned_stop.has_value());
  // The lost worker's stream closing afterwards does not rename the cause.
  recovery_.NoteLostWorker("w1", "lost worker w1: its control stream closed");
  EXPECT_EQ(host_.jobs.at("job-1").status.attempts(1).cause(), v1::END_CAUSE_PREEMPTED);
}

TEST_F(JobRecoveryTest, APlannedStopNeedsARunningJobWithCheckpointsAndExpires) {
  host_.jobs["job-1"] = RunningJob();  // no checkpoint.dir
  PlannedStops planned(&host_, &recovery_);
  EXPECT_FALSE(planned.Begin("job-1", host_.jobs.at("job-1"), "why", v1::END_CAUSE_PREEMPTED));
  host_.jobs["job-1"] = RunningJob("checkpoint: {dir: /tmp/never-written}\n");
  LiveJob& job = host_.jobs.at("job-1");
  ASSERT_TRUE(planned.Begin("job-1", job, "why", v1::END_CAUSE_PREEMPTED));
  planned.CheckDeadlines(absl::Now());
  EXPECT_TRUE(job.attempt.planned_stop.has_value());
  planned.CheckDeadlines(absl::Now() + PlannedStops::kTimeout + absl::Seconds(1));
  EXPECT_FALSE(job.attempt.planned_stop.has_value());
  EXPECT_THAT(host_.progress.back(), HasSubstr("why: no checkpoint within"));
  EXPECT_TRUE(host_.stopped.empty());
}

// Rebalancing's detection: every stage's pace over its plan goes to the
// summary; a uniform drift is no imbalance; one stage over the median by
// more than the threshold for window_steps steps in a row has the job
// re-planned (here without profiles, so it says why it does not move).
TEST_F(JobRecoveryTest, OneStageOverItsPlanForAWindowHasTheJobReplanned) {
  host_.jobs["job-1"] = RunningJob("checkpoint: {dir: /tmp/never-written}\n");
  LiveJob& job = host_.jobs.at("job-1");
  job.spec.rebalance.threshold = 0.15;  // (a planned job's; the spec rules are job_spec's)
  job.spec.rebalance.window_steps = 20;
  auto& summary = *job.status.mutable_summary();
  summary["plan.stage0.seconds_per_batch"] = 0.010;
  summary["plan.stage1.seconds_per_batch"] = 0.020;
  WorkerRegistry registry;
  Scheduler scheduler(&registry);
  PlannedStops planned(&host_, &recovery_);
  Rebalancer rebalancer(&host_, &planned, &scheduler);
  const absl::Time now = absl::Now();
  // Both 30% over their plans: the same for both, nothing to do.
  for (int64_t step = 0; step <= 40; step += 5) {
    job.status.set_step(step);
    rebalancer.OnComputeTime("job-1", job, 0, step, 0.013 * step, now);
    rebalancer.OnComputeTime("job-1", job, 1, step, 0.026 * step, now);
  }
  EXPECT_NEAR(job.status.summary().at("stage0.pace_over_plan"), 1.3, 1e-9);
  EXPECT_NEAR(job.status.summary().at("stage1.pace_over_plan"), 1.3, 1e-9);
  EXPECT_EQ(job.attempt.imbalanced_since, -1);
  // From step 45 on stage 0 runs at twice its plan, stage 1 at its plan.
  double c0 = 0.013 * 40, c1 = 0.026 * 40;
  for (int64_t step = 45; step <= 100; step += 5) {
    c0 += 0.020 * 5;  // 2x
    c1 += 0.020 * 5;  // 1x
    job.status.set_step(step);
    rebalancer.OnComputeTime("job-1", job, 0, step, c0, now);
    rebalancer.OnComputeTime("job-1", job, 1, step, c1, now);
    if (!host_.progress.empty() &&
        host_.progress.back().find("not rebalancing") != std::string::npos) {
      break;
    }
  }
  ASSERT_FALSE(host_.progress.empty());
  EXPECT_THAT(host_.progress.back(), HasSubstr("not rebalancing: no profile of worker w0"));
  EXPECT_GE(job.status.step() - 45, 20);  // not before a whole window
  EXPECT_FALSE(job.attempt.planned_stop.has_value());
}

TEST_F(JobRecoveryTest, StageErrorsRecoverOnlyWhenTransient) {
  host_.jobs["job-1"] = RunningJob();
  v1::StageError e;
  e.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  e.set_message("the stream broke");
  recovery_.OnStageError("job-1", host_.jobs.at("job-1"), 1, e);
  EXPECT_EQ(host_.jobs.at("job-1").status.state(), v1::RECOVERING);
  EXPECT_TRUE(host_.ended.empty());

  host_.jobs["job-2"] = RunningJob();
  e.set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  e.set_message("stage 1: the loss is NaN");
  recovery_.OnStageError("job-2", host_.jobs.at("job-2"), 1, e);
  ASSERT_EQ(host_.ended.size(), 1u);
  EXPECT_EQ(host_.ended[0].reason, "stage 1: the loss is NaN");

  // A transient error of no stage (profiling) is not a stage's: it fails.
  host_.jobs["job-3"] = RunningJob();
  e.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  recovery_.OnStageError("job-3", host_.jobs.at("job-3"), -1, e);
  EXPECT_EQ(host_.ended.size(), 2u);
}

TEST(LiveJob, TheStallLimitFollowsTheMeasuredStepTime) {
  LiveJob job = RunningJob();
  EXPECT_EQ(StallDeadline(job), absl::InfiniteFuture());  // the attempt has not started
  const absl::Time t0 = absl::Now();
  job.attempt.progressed = t0;
  EXPECT_EQ(StallLimit(job), absl::Seconds(300));  // nothing measured: the floor
  for (int i = 1; i <= 100; ++i) NoteProgress(job, i, t0 + absl::Seconds(30 * i));
  EXPECT_EQ(StallLimit(job), absl::Seconds(600));  // 20 x 30 s
  EXPECT_EQ(StallDeadline(job), t0 + absl::Seconds(3000 + 600));
  NoteProgress(job, 100, t0 + absl::Seconds(3500));  // the same step again: no progress
  EXPECT_EQ(StallDeadline(job), t0 + absl::Seconds(3600));
  NoteProgress(job, -1, t0 + absl::Seconds(3500));  // an evaluation is progress
  EXPECT_EQ(StallDeadline(job), t0 + absl::Seconds(4100));
  // Through the reports: an evaluation at a new step is progress, the same
  // evaluation again is not.
  v1::MetricsReport eval;
  eval.set_step(100);
  (*eval.mutable_values())["eval_accuracy"] = 0.5;
  ApplyMetrics(job, 1, eval, t0 + absl::Seconds(3600));
  EXPECT_EQ(StallDeadline(job), t0 + absl::Seconds(4200));
  ApplyMetrics(job, 1, eval, t0 + absl::Seconds(3700));
  EXPECT_EQ(StallDeadline(job), t0 + absl::Seconds(4200));
  ApplyMetrics(job, 0, eval, t0 + absl::Seconds(3800));  // not the last stage: nothing
  EXPECT_EQ(StallDeadline(job), t0 + absl::Seconds(4200));
  job.spec.recovery.stall_seconds = 5;
  EXPECT_EQ(StallLimit(job), absl::Seconds(5));
  job.status.set_state(v1::RECOVERING);
  EXPECT_EQ(StallDeadline(job), absl::InfiniteFuture());
}

TEST_F(JobRecoveryTest, AJobThatStopsAdvancingIsRecoveredAsStalled) {
  LiveJob job = RunningJob("recovery: {max_restarts: 3, stall_seconds: 60}\n");
  const absl::Time t0 = absl::Now();
  job.attempt.progressed = t0;
  host_.jobs["job-1"] = job;
  recovery_.CheckDeadlines(t0 + absl::Seconds(59));
  EXPECT_EQ(host_.jobs.at("job-1").status.state(), v1::RUNNING);
  NoteProgress(host_.jobs.at("job-1"), 5, t0 + absl::Seconds(50));
  recovery_.CheckDeadlines(t0 + absl::Seconds(100));
  EXPECT_EQ(host_.jobs.at("job-1").status.state(), v1::RUNNING);
  recovery_.CheckDeadlines(t0 + absl::Seconds(111));
  const LiveJob& recovered = host_.jobs.at("job-1");
  EXPECT_EQ(recovered.status.state(), v1::RECOVERING);
  EXPECT_EQ(recovered.status.attempts(1).cause(), v1::END_CAUSE_STALLED);
  EXPECT_THAT(
      recovered.status.attempts(1).end_reason(),
      HasSubstr("stalled: no progress past step 5 for 1m1s (limit 1m, recovery.stall_seconds)"));
  EXPECT_EQ(StallDeadline(recovered), absl::InfiniteFuture());
}

TEST_F(JobRecoveryTest, ACorruptCheckpointsAttemptIsNotARestart) {
  // Attempt 0 ended on a fault; attempt 1 never ran: its checkpoint was corrupt.
  host_.jobs["job-1"] = RunningJob("recovery: {max_restarts: 1}\n");
  recovery_.Recover("job-1", "checkpoint /c/step-20 is corrupt", v1::END_CAUSE_CORRUPT_CHECKPOINT);
  EXPECT_TRUE(host_.ended.empty());
  ASSERT_EQ(host_.requeued.size(), 1u);
  EXPECT_EQ(host_.jobs.at("job-1").status.attempts(1).cause(), v1::END_CAUSE_CORRUPT_CHECKPOINT);
}

TEST_F(JobRecoveryTest, ALossReportedAfterTheAttemptEndedBecomesItsCause) {
  host_.jobs["job-1"] = RunningJob();
  recovery_.Recover("job-1", "the stream from stage 0 broke", v1::END_CAUSE_STAGE_ERROR);
  const v1::JobAttempt& a = host_.jobs.at("job-1").status.attempts(1);
  recovery_.NoteLostWorker("w9", "lost worker w9: gone");  // not one of the attempt's
  EXPECT_EQ(a.cause(), v1::END_CAUSE_STAGE_ERROR);
  recovery_.NoteLostWorker("w0", "lost worker w0: stream closed");
  EXPECT_EQ(a.cause(), v1::END_CAUSE_WORKER_LOST);
  EXPECT_EQ(a.end_reason(),
            "lost worker w0: stream closed (first reported: the stream from stage 0 broke)");
  recovery_.NoteLostWorker("w1", "lost worker w1: stream closed");  // the cause is named once
  EXPECT_THAT(a.end_reason(), StartsWith("lost worker w0"));
}

class CheckpointCommitTest : public ::testing::Test {
 protected:
  CheckpointCommitTest()
      : root_(::testing::TempDir() + "commit_test_" + std::to_string(::getpid())),
        metrics_(registry_),
        committer_(&host_, &metrics_) {
    std::filesystem::remove_all(root_);
  }
  ~CheckpointCommitTest() override { std::filesystem::remove_all(root_); }

  // Stage `stage` wrote its shard of `step` (`bytes_claimed`: what it says).
  v1::CheckpointSaved Shard(int stage, int64_t step, int64_t bytes_claimed = -1) {
    const std::string dir = checkpoint::StepDir(root_, "job-1", step);
    const std::string data = "shard " + std::to_string(stage);
    EXPECT_TRUE(
        checkpoint::WriteFileAtomically(dir + "/" + checkpoint::ShardFileName(stage), data).ok());
    v1::CheckpointSaved saved;
    saved.set_step(step);
    saved.set_phase_step(step);
    saved.set_path(dir + "/" + checkpoint::ShardFileName(stage));
    saved.set_bytes(bytes_claimed >= 0 ? bytes_claimed : static_cast<int64_t>(data.size()));
    saved.set_crc32(checkpoint::Crc32(data));
    return saved;
  }

  const std::string root_;
  prometheus::Registry registry_;
  metrics::CoordinatorMetrics metrics_;
  FakeJobHost host_;
  CheckpointCommitter committer_;
};

TEST_F(CheckpointCommitTest, CommitsOnceEveryStagesShardIsIn) {
  host_.jobs["job-1"] = RunningJob("checkpoint: {dir: " + root_ + ", every_steps: 10}\n");
  LiveJob& job = host_.jobs.at("job-1");
  committer_.OnShardSaved("job-1", job, 0, Shard(0, 10));
  EXPECT_EQ(job.status.last_checkpoint_step(), 0);
  EXPECT_TRUE(checkpoint::ListCommitted(root_, "job-1", false, nullptr).empty());
  committer_.OnShardSaved("job-1", job, 1, Shard(1, 10));
  EXPECT_EQ(job.status.last_checkpoint_step(), 10);
  const auto committed = checkpoint::ListCommitted(root_, "job-1", false, nullptr);
  ASSERT_EQ(committed.size(), 1u);
  EXPECT_EQ(committed[0].manifest.shards_size(), 2);
  EXPECT_EQ(committed[0].manifest.attempt(), 1);
  EXPECT_EQ(committed[0].manifest.shards(1).block_begin(), 2);
  EXPECT_THAT(host_.progress.back(), HasSubstr("checkpoint at step 10 committed"));
  EXPECT_TRUE(job.attempt.shards.empty());
}

TEST_F(CheckpointCommitTest, AShardTheCoordinatorCannotSeeIsNotCommitted) {
  host_.jobs["job-1"] = RunningJob("checkpoint: {dir: " + root_ + ", every_steps: 10}\n");
  LiveJob& job = host_.jobs.at("job-1");
  committer_.OnShardSaved("job-1", job, 0, Shard(0, 10));
  committer_.OnShardSaved("job-1", job, 1, Shard(1, 10, /*bytes_claimed=*/999));
  EXPECT_EQ(job.status.last_checkpoint_step(), 0);
  EXPECT_THAT(host_.progress.back(), HasSubstr("NOT committed"));
  EXPECT_THAT(host_.progress.back(), HasSubstr("same shared volume"));
  EXPECT_TRUE(host_.ended.empty());  // the job goes on
}

TEST_F(CheckpointCommitTest, JobsWithoutACheckpointDirAndBadStagesAreIgnored) {
  host_.jobs["job-1"] = RunningJob();
  committer_.OnShardSaved("job-1", host_.jobs.at("job-1"), 0, Shard(0, 10));
  EXPECT_TRUE(host_.jobs.at("job-1").attempt.shards.empty());
  host_.jobs["job-2"] = RunningJob("checkpoint: {dir: " + root_ + ", every_steps: 10}\n");
  committer_.OnShardSaved("job-2", host_.jobs.at("job-2"), 5, Shard(0, 10));
  EXPECT_TRUE(host_.jobs.at("job-2").attempt.shards.empty());
}

TEST(JobStatusView, PublishesToWatchersAndForgetsEndedJobs) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  JobStatusView view(store->get());
  v1::JobStatus st;
  st.set_job_id("job-1");
  st.set_owner("ann");
  st.set_state(v1::RUNNING);
  view.Publish(st, "");
  EXPECT_EQ(view.CountOwnedBy("ann"), 1);
  EXPECT_EQ(view.CountOwnedBy("bob"), 0);
  std::vector<std::string> messages;
  auto sub = view.Subscribe("job-1", [&](const v1::JobEvent& e) {
    messages.push_back(e.message() + "/" + v1::JobState_Name(e.status().state()));
  });
  ASSERT_TRUE(sub.ok());
  st.set_state(v1::SUCCEEDED);
  view.Publish(st, "done");
  EXPECT_THAT(messages, ::testing::ElementsAre("/RUNNING", "done/SUCCEEDED"));
  EXPECT_FALSE(view.Find("job-1").has_value());
  EXPECT_EQ(view.CountOwnedBy("ann"), 0);
  view.Unsubscribe(*sub);
  // Neither live nor stored: NOT_FOUND.
  EXPECT_EQ(view.Subscribe("job-9", [](const v1::JobEvent&) {}).status().code(),
            absl::StatusCode::kNotFound);
}

// docs/architecture.md names every RPC of the Coordinator service, every
// command and every worker event (the page drifted before).
TEST(ArchitectureDoc, NamesEveryRpcCommandAndEvent) {
  std::ifstream in(std::string(STAGEWISE_SOURCE_DIR) + "/docs/architecture.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(doc.empty());
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "stagewise.v1.Coordinator");
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string& name = service->method(i)->name();
    EXPECT_NE(doc.find("`" + name), std::string::npos) << "RPC " << name;
  }
  for (const google::protobuf::OneofDescriptor* oneof :
       {v1::WorkerEvent::descriptor()->FindOneofByName("event"),
        v1::Command::descriptor()->FindOneofByName("command")}) {
    ASSERT_NE(oneof, nullptr);
    for (int i = 0; i < oneof->field_count(); ++i) {
      const std::string& name = oneof->field(i)->name();
      EXPECT_NE(doc.find("`" + name + "`"), std::string::npos)
          << oneof->containing_type()->name() << "." << name;
    }
  }
}

}  // namespace
}  // namespace stagewise::coordinator
