// Sharing the pool (docs/operations.md, "Sharing the cluster"): the
// scheduling config and its errors, owners' usage, the scheduler's order by
// class and fair share with quotas, and priority preemption through the
// JobManager (a planned stop of a lower class's job).
#include "services/spec/sharing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/goodput.h"
#include "coordinator/owner_usage.h"
#include "coordinator/scheduler.h"
#include "services/checkpoint/checkpoint.h"
#include "services/spec/job_spec.h"
#include "tests/unit/coordinator_fakes.h"
#include "tests/unit/job_manager_fixture.h"

namespace stagewise::coordinator {
namespace {

using ::testing::ElementsAre;
using testing::FakeSink;
using ::testing::HasSubstr;
using testing::Info;
using testing::JobManagerTest;
using testing::JobYaml;
using ::testing::Not;

constexpr char kConfig[] = R"(
classes:
  - name: production
  - research
  - {name: batch, preempt: false}
default_class: research
owners:
  alice: {weight: 1, max_workers: 3}
  bob: {weight: 1, max_running_jobs: 1}
  carol: {weight: 2}
default_owner: {weight: 0.5}
pool_workers: 8
fair_share: {half_life_seconds: 600}
)";

SharingConfig Config(const std::string& text = kConfig) {
  absl::StatusOr<SharingConfig> config = ParseSharingConfig(text);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : SharingConfig{};
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<SharingConfig> config = ParseSharingConfig(text);
  EXPECT_FALSE(config.ok()) << text;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  return std::string(config.status().message());
}

TEST(SharingConfigTest, ReadsClassesOwnersAndDefaults) {
  const SharingConfig c = Config();
  ASSERT_EQ(c.classes.size(), 3u);
  EXPECT_EQ(c.classes[1].name, "research");
  EXPECT_TRUE(c.Preempts(0));
  EXPECT_FALSE(c.Preempts(2));
  EXPECT_EQ(c.RankOf("").value(), 1);  // the default class
  EXPECT_EQ(c.RankOf("batch").value(), 2);
  EXPECT_EQ(c.NameOf(0), "production");
  EXPECT_EQ(c.OwnerOf("carol").weight, 2);
  EXPECT_EQ(c.OwnerOf("alice").max_workers, 3);
  EXPECT_EQ(c.OwnerOf("dave").weight, 0.5);  // default_owner
  EXPECT_EQ(c.OwnerOf("").weight, 0.5);      // anonymous
  EXPECT_EQ(c.half_life_seconds, 600);
  // Without default_class the last class is the default; no file: one class.
  EXPECT_EQ(Config("classes: [a, b]").default_class, "b");
  EXPECT_EQ(Config("{}").RankOf("").value(), 0);
}

TEST(SharingConfigTest, ErrorsNameTheKey) {
  EXPECT_THAT(ErrorOf("owners: {bob: {weight: -1}}"), HasSubstr("owners.bob.weight"));
  EXPECT_THAT(ErrorOf("owners: {bob: {weight: 0}}"), HasSubstr("must be a number > 0"));
  EXPECT_THAT(ErrorOf("default_owner: {max_workers: -2}"),
              HasSubstr("default_owner.max_workers: must be >= 0"));
  EXPECT_THAT(ErrorOf("pool_workers: 4\nowners: {alice: {max_workers: 5}}"),
              HasSubstr("owners.alice.max_workers: 5 is more than the pool's 4 workers"));
  EXPECT_THAT(ErrorOf("classes: [a, a]"), HasSubstr("classes[1].name: class 'a' is listed twice"));
  EXPECT_THAT(ErrorOf("classes: [a]\ndefault_class: b"),
              HasSubstr("default_class: unknown class 'b'; this coordinator's classes are a"));
  EXPECT_THAT(ErrorOf("default_class: b"), HasSubstr("default_class"));
  EXPECT_THAT(ErrorOf("owners: {bob: {wieght: 2}}"), HasSubstr("did you mean owners.bob.weight"));
  EXPECT_THAT(ErrorOf("clases: [a]"), HasSubstr("clases"));
  EXPECT_THAT(ErrorOf("fair_share: {half_life_seconds: 0}"),
              HasSubstr("fair_share.half_life_seconds"));
  EXPECT_THAT(ErrorOf("classes: [{name: 'a b'}]"), HasSubstr("classes[0].name"));
  EXPECT_THAT(ErrorOf("classes: ["), Not(HasSubstr("classes:")));  // a YAML error, with its place
}

TEST(SharingConfigTest, JobsAreCheckedAgainstClassesAndQuotas) {
  const SharingConfig c = Config();
  JobSpec spec;
  spec.stages.count = 2;
  EXPECT_TRUE(CheckJobAgainst(c, spec, "alice").ok());
  spec.priority = "urgent";
  absl::Status s = CheckJobAgainst(c, spec, "alice");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("priority: unknown class 'urgent'; this coordinator's "
                                     "classes are production, research, batch"));
  spec.priority = "batch";
  spec.stages.count = 4;
  s = CheckJobAgainst(c, spec, "alice");
  EXPECT_THAT(s.message(), HasSubstr("owners.alice.max_workers"));
  spec.recovery.min_stages = 2;  // a first placement takes all 4 all the same
  EXPECT_THAT(CheckJobAgainst(c, spec, "alice").message(),
              HasSubstr("stages: the job needs 4 workers, but alice may hold at most 3"));
  // A class open to some owners only.
  const SharingConfig open = Config(
      "classes: [{name: top, owners: [ci]}, low]\n"
      "owners: {dave: {weight: 3}}\ndefault_owner: {max_workers: 2}");
  spec.priority = "top";
  spec.stages.count = 1;
  EXPECT_TRUE(CheckJobAgainst(open, spec, "ci").ok());
  s = CheckJobAgainst(open, spec, "bob");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(),
              HasSubstr("priority: class top is open to ci only, not to bob (classes[0].owners)"));
  // dave's max_workers is default_owner's: the error says where it comes from.
  spec.priority = "low";
  spec.stages.count = 3;
  EXPECT_THAT(CheckJobAgainst(open, spec, "dave").message(),
              HasSubstr("(the coordinator's scheduling config, default_owner.max_workers)"));
  // A coordinator without classes refuses any class.
  EXPECT_THAT(CheckJobAgainst(SharingConfig{}, spec, "").message(),
              HasSubstr("this coordinator has no priority classes"));
}

TEST(OwnerUsageTest, IntegratesHeldWorkersAndDecaysOldUse) {
  OwnerUsage usage(absl::Seconds(100));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  usage.Hold("j1", "alice", 2, t0);
  usage.Hold("j2", "bob", 1, t0);
  EXPECT_EQ(usage.HeldWorkers("alice"), 2);
  EXPECT_EQ(usage.TotalHeld(), 3);
  usage.Release("j1", t0 + absl::Seconds(50));
  usage.Release("j1", t0 + absl::Seconds(60));  // twice: nothing more
  EXPECT_EQ(usage.HeldWorkers("alice"), 0);
  EXPECT_EQ(usage.HeldJobs("bob"), 1);
  EXPECT_DOUBLE_EQ(usage.WorkerSeconds("alice", t0 + absl::Seconds(300)), 100);
  EXPECT_DOUBLE_EQ(usage.WorkerSeconds("bob", t0 + absl::Seconds(300)), 300);
  // One worker for 100 s, one half-life later: 100 / ln 2 x (1 - 1/2), then halved.
  const double h = 100 / std::log(2.0);
  EXPECT_NEAR(usage.DecayedWorkerSeconds("bob", t0 + absl::Seconds(100)), h * 0.5, 1e-9);
  EXPECT_NEAR(usage.DecayedWorkerSeconds("alice", t0 + absl::Seconds(150)),
              2 * h * (1 - std::exp2(-0.5)) * 0.5, 1e-9);
  // Holding again replaces the job's count.
  usage.Hold("j2", "bob", 3, t0 + absl::Seconds(300));
  EXPECT_EQ(usage.HeldWorkers("bob"), 3);
  EXPECT_EQ(usage.HeldJobs("bob"), 1);
  EXPECT_EQ(usage.AllWorkerSeconds(t0 + absl::Seconds(310)).at("bob"), 330);
}

class SharingSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 4; ++i) AddWorker("w" + std::to_string(i));
    scheduler_.SetSharing(&config_, &usage_);
  }
  void AddWorker(const std::string& id) {
    std::optional<WorkerRegistry::Removed> replaced;
    std::string session;
    ASSERT_TRUE(registry_.Register(Info(id), {}, absl::Now(), &replaced, &session).ok());
    sinks_.push_back(std::make_unique<FakeSink>());
    ASSERT_TRUE(registry_.Connect(id, session, {}, sinks_.back().get(), absl::Now()).ok());
  }
  Scheduler::Request Job(const std::string& id, int workers, const std::string& owner, int rank) {
    Scheduler::Request r{id, workers, false};
    r.owner = owner;
    r.rank = rank;
    return r;
  }
  std::vector<std::string> Placed(const Scheduler::Round& round) {
    std::vector<std::string> ids;
    for (const auto& p : round.placed) {
      ids.push_back(p.job_id);
      usage_.Hold(p.job_id, owners_[p.job_id], static_cast<int>(p.workers.size()), now_);
    }
    return ids;
  }
  void Enqueue(const std::string& id, int workers, const std::string& owner, int rank) {
    owners_[id] = owner;
    scheduler_.Enqueue(Job(id, workers, owner, rank));
  }
  void Release(const std::string& id) {
    registry_.Release(id);
    usage_.Release(id, now_);
  }

  SharingConfig config_ = Config();
  OwnerUsage usage_{absl::Hours(1)};
  absl::Time now_ = absl::Now();
  std::map<std::string, std::string> owners_;
  std::vector<std::unique_ptr<FakeSink>> sinks_;
  WorkerRegistry registry_;
  Scheduler scheduler_{&registry_};
};

TEST_F(SharingSchedulerTest, HigherClassesGoFirstAndLowerOnesDoNotBackfillTheirWorkers) {
  Enqueue("low", 1, "dave", 2);
  Enqueue("mid", 3, "dave", 1);
  Enqueue("top", 2, "dave", 0);
  Scheduler::Round round = scheduler_.Schedule(now_);
  // top (2) and then mid (3) do not both fit: mid waits for workers, and
  // low (a lower class) may not take what mid needs.
  EXPECT_THAT(Placed(round), ElementsAre("top"));
  ASSERT_EQ(round.waiting.size(), 2u);
  EXPECT_EQ(round.waiting[0].job_id, "mid");
  EXPECT_EQ(round.waiting[0].waits_for, Scheduler::Waiting::For::kWorkers);
  EXPECT_THAT(round.waiting[0].reason, HasSubstr("class research: waiting for 3 idle workers"));
  EXPECT_EQ(round.waiting[1].job_id, "low");
  EXPECT_EQ(round.waiting[1].waits_for, Scheduler::Waiting::For::kHigherClass);
  EXPECT_THAT(round.waiting[1].reason, HasSubstr("behind mid of a higher class"));
  // top ends: mid goes, then low takes the last worker.
  Release("top");
  EXPECT_THAT(Placed(scheduler_.Schedule(now_)), ElementsAre("mid", "low"));
}

TEST_F(SharingSchedulerTest, OwnersAtTheirQuotaWait) {
  Enqueue("a1", 2, "alice", 1);
  Enqueue("a2", 2, "alice", 1);  // 4 > alice's 3
  Enqueue("b1", 1, "bob", 1);
  Enqueue("b2", 1, "bob", 1);  // bob runs one job at a time
  Scheduler::Round round = scheduler_.Schedule(now_);
  EXPECT_THAT(Placed(round), ElementsAre("a1", "b1"));
  ASSERT_EQ(round.waiting.size(), 2u);
  EXPECT_EQ(round.waiting[0].waits_for, Scheduler::Waiting::For::kQuota);
  EXPECT_THAT(round.waiting[0].reason,
              HasSubstr("quota: alice holds 2 workers and this job needs 2, at most 3 "
                        "(owners.alice.max_workers)"));
  EXPECT_THAT(round.waiting[1].reason,
              HasSubstr("quota: bob runs 1 jobs, at most 1 (owners.bob.max_running_jobs)"));
}

TEST_F(SharingSchedulerTest, TheOwnerThatUsedLeastPerWeightGoesFirst) {
  // carol (weight 2) used 300 worker-seconds, bob (weight 1) 200: per unit
  // of weight carol's 150 is less, so carol's job goes first although bob's
  // came first.
  usage_.Hold("old-b", "bob", 1, now_ - absl::Seconds(200));
  usage_.Release("old-b", now_);
  usage_.Hold("old-c", "carol", 1, now_ - absl::Seconds(300));
  usage_.Release("old-c", now_);
  Enqueue("b", 4, "bob", 1);
  Enqueue("c", 4, "carol", 1);
  EXPECT_THAT(Placed(scheduler_.Schedule(now_)), ElementsAre("c"));
}

TEST_F(SharingSchedulerTest, GpuWorkersCountSeparatelyDominantResourceStyle) {
  // Two of the six workers are on CUDA devices.
  for (const std::string id : {"g0", "g1"}) {
    v1::WorkerInfo info = Info(id);
    info.set_device("cuda:0");
    std::optional<WorkerRegistry::Removed> replaced;
    std::string session;
    ASSERT_TRUE(registry_.Register(info, {}, now_, &replaced, &session).ok());
    sinks_.push_back(std::make_unique<FakeSink>());
    ASSERT_TRUE(registry_.Connect(id, session, {}, sinks_.back().get(), now_).ok());
  }
  // erin used 2 GPU workers for 100 s (all of the GPUs: a share of 1); frank
  // 4 CPU workers for 100 s (4 of 6 workers: 2/3). By workers alone erin's
  // 200 worker-seconds are less than frank's 400; by dominant share frank's is.
  usage_.Hold("old-a", "erin", 2, now_ - absl::Seconds(100), 2);
  usage_.Release("old-a", now_);
  usage_.Hold("old-b", "frank", 4, now_ - absl::Seconds(100), 0);
  usage_.Release("old-b", now_);
  EXPECT_EQ(usage_.HeldGpuWorkers("erin"), 0);
  EXPECT_GT(usage_.DecayedGpuWorkerSeconds("erin", now_), 0);
  Enqueue("a", 6, "erin", 1);
  Enqueue("b", 6, "frank", 1);
  EXPECT_THAT(Placed(scheduler_.Schedule(now_)), ElementsAre("b"));
}

// Preemption through the manager: a production job takes the workers of a
// running research job, which checkpoints at its next step and resumes
// after it, behind it in the queue.
class PreemptionTest : public JobManagerTest {
 protected:
  void SetUp() override {
    JobManagerTest::SetUp();
    root_ = ::testing::TempDir() + "preempt_" + std::to_string(::getpid());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override {
    JobManagerTest::TearDown();
    std::filesystem::remove_all(root_);
  }
  JobManagerOptions SharingOptions() {
    JobManagerOptions o = Options();
    o.sharing = Config();
    return o;
  }
  std::string Yaml(const std::string& priority, const std::string& extra = "") {
    return JobYaml(2, 40,
                   "priority: " + priority + "\ncheckpoint: {dir: " + root_ +
                       ", every_steps: 1000}\n" + extra);
  }
  std::string SubmitAs(const std::string& owner, const std::string& yaml) {
    auto id = manager_->Submit(yaml, owner);
    EXPECT_TRUE(id.ok()) << id.status();
    Sync();
    return id.ok() ? *id : "";
  }
  void Saved(const std::string& id, const std::string& w, int stage, int64_t step) {
    manager_->OnEvent(testing::SavedShard(root_, id, w, stage, step));
  }
  std::string root_;
};

TEST_F(PreemptionTest, AHigherClassTakesTheWorkersOfALowerOneThroughAPlannedStop) {
  StartManager(SharingOptions());
  AddWorker("w0");
  AddWorker("w1");
  // A victim waits as long as it takes: not failed after recovery.wait_seconds.
  const std::string low = SubmitAs("bob", Yaml("research", "recovery: {wait_seconds: 1}\n"));
  AckAll({"w0", "w1"});
  ASSERT_EQ(Status(low).state(), v1::RUNNING);
  EXPECT_EQ(Status(low).priority(), "research");
  manager_->OnEvent(testing::MetricsEvent("w1", low, 1, 7, 1.0));
  Sync();
  // A batch job does not preempt; a production job does.
  const std::string batch = SubmitAs("carol", Yaml("batch"));
  EXPECT_TRUE(Sink("w0").Of(v1::Command::kCheckpointSoon).empty());
  const std::string high = SubmitAs("alice", Yaml("production"));
  ASSERT_EQ(Sink("w0").Of(v1::Command::kCheckpointSoon).size(), 1u);  // stage 0 of the victim
  EXPECT_EQ(Status(high).state(), v1::PENDING);
  // Stage 0 picks step 8; both shards of step 8 commit it: the stop.
  v1::WorkerEvent planned;
  planned.set_worker_id("w0");
  planned.set_job_id(low);
  planned.mutable_checkpoint_planned()->set_step(8);
  manager_->OnEvent(planned);
  manager_->OnEvent(testing::MetricsEvent("w1", low, 1, 8, 1.0));
  Saved(low, "w0", 0, 8);
  Saved(low, "w1", 1, 8);
  Sync();
  const v1::JobStatus victim = Status(low);
  ASSERT_EQ(victim.attempts_size(), 1);
  EXPECT_EQ(victim.attempts(0).cause(), v1::END_CAUSE_PRIORITY);
  EXPECT_EQ(victim.attempts(0).preempted_by(), high);
  EXPECT_THAT(victim.attempts(0).end_reason(),
              HasSubstr("preempted by job " + high + " (class production, waiting for 2 workers)"));
  EXPECT_THAT(victim.attempts(0).end_reason(), HasSubstr("0 steps past it to redo"));
  // The production job has the workers; the victim waits ahead of batch.
  EXPECT_EQ(Status(high).state(), v1::CONFIGURING);
  EXPECT_EQ(Sink("w0").Of(v1::Command::kConfigure).back().configure().job_id(), high);
  EXPECT_NE(Status(low).state(), v1::RUNNING);
  AckAll({"w0", "w1"});
  absl::SleepFor(absl::Milliseconds(1600));  // past the victim's recovery.wait_seconds
  Sync();
  EXPECT_EQ(Status(low).state(), v1::RECOVERING) << Status(low).reason();
  EXPECT_EQ(Status(low).queue_position(), 1);
  EXPECT_EQ(Status(batch).queue_position(), 2);
  // The restart is planned: not counted against max_restarts, and its event says why.
  auto events = manager_->JobEvents(low);
  ASSERT_TRUE(events.ok());
  bool noted = false;
  for (const auto& e : events->events()) {
    noted = noted || absl::StrContains(e.reason(), "preempted by job " + high);
  }
  EXPECT_TRUE(noted);
}

TEST_F(PreemptionTest, NoStopWhenTheLowerClassesCannotMakeRoom) {
  StartManager(SharingOptions());
  AddWorker("w0");
  AddWorker("w1");
  AddWorker("w2");
  const std::string low = SubmitAs("bob", Yaml("research"));
  AckAll({"w0", "w1"});
  ASSERT_EQ(Status(low).state(), v1::RUNNING);
  // 4 workers: more than the research job and the idle worker together.
  const std::string big =
      SubmitAs("carol", JobYaml(4, 40, "priority: production\ncheckpoint: {dir: " + root_ + "}\n"));
  EXPECT_TRUE(Sink("w0").Of(v1::Command::kCheckpointSoon).empty());
  EXPECT_EQ(Status(big).state(), v1::PENDING);
  // An unknown class and a job over its owner's quota are refused at submit.
  auto bad = manager_->Submit(Yaml("urgent"), "bob");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("priority: unknown class 'urgent'"));
  bad = manager_->Submit(JobYaml(4, 40), "alice");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("owners.alice.max_workers"));
}

TEST(SharingConfigTest, TheDeployExampleLoads) {
  absl::StatusOr<SharingConfig> c =
      LoadSharingConfig(STAGEWISE_SOURCE_DIR "/deploy/scheduling.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->classes.size(), 3u);
  EXPECT_EQ(c->OwnerOf("ci").weight, 2);
  absl::StatusOr<SharingConfig> missing = LoadSharingConfig("/nonexistent/scheduling.yaml");
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/scheduling.yaml"));
}

TEST(GoodputTest, AnAttemptsTimeSplitsIntoUses) {
  const absl::Time t0 = absl::FromUnixSeconds(5000);
  AttemptUse use;
  EXPECT_FALSE(use.placed());
  use.Placed(2, t0);
  use.Running(t0 + absl::Seconds(10));  // 2 x 10 s of startup
  use.Running(t0 + absl::Seconds(50));  // only the first counts
  // Two stages computed 60 s and 50 s, stage 0's checkpoint write of 4 s
  // among them; the slowest write of step 10 (4 s) stalls both workers.
  use.Compute(0, 30);
  use.Compute(0, 60);
  use.Compute(1, 50);
  use.Compute(1, 40);  // cumulative: an older report changes nothing
  use.CheckpointWrite(10, 0, 4);
  use.CheckpointWrite(10, 1, 1);
  // Ends at 100 s: 2 x 90 s running; 3 s of steps past the checkpoint redone.
  const WorkerSecondsByUse u = use.Close(t0 + absl::Seconds(100), 1, 0, 3);
  EXPECT_DOUBLE_EQ(u.startup, 20);
  EXPECT_DOUBLE_EQ(u.checkpoint, 8);
  EXPECT_DOUBLE_EQ(u.recovery, 6);
  EXPECT_DOUBLE_EQ(u.productive, 60 + 50 - 5 - 6);
  EXPECT_DOUBLE_EQ(u.Held(), 200);  // every held second has one use
  EXPECT_DOUBLE_EQ(u.bubble, 200 - 20 - 8 - 6 - 99);
  // Replicas multiply the compute of replica 0's stages.
  const WorkerSecondsByUse r = use.Close(t0 + absl::Seconds(100), 2, 0, 0);
  EXPECT_DOUBLE_EQ(r.productive, 180 - 8);  // capped by the running time left
  EXPECT_DOUBLE_EQ(r.bubble, 0);
  // As summary entries and back.
  v1::JobStatus st;
  WriteUse(u, st.mutable_summary());
  EXPECT_DOUBLE_EQ(st.summary().at("goodput.productive"), u.productive);
  EXPECT_DOUBLE_EQ(ReadUse(st.summary()).bubble, u.bubble);
  const v1::Goodput g = ToProto(u);
  EXPECT_DOUBLE_EQ(g.goodput(), (u.productive + u.bubble) / 200);
  EXPECT_DOUBLE_EQ(g.compute_share(), u.productive / (u.productive + u.bubble));
}

TEST(GoodputTest, TheClusterSplitsIdleTimeByWhetherAJobWaited) {
  const absl::Time t0 = absl::FromUnixSeconds(9000);
  ClusterUse c;
  c.Tick(t0, 4, 0, false);                      // 4 idle, nothing queued
  c.Tick(t0 + absl::Seconds(10), 4, 3, true);   // 3 held, a job waits
  c.Tick(t0 + absl::Seconds(30), 4, 4, false);  // all held
  c.Tick(t0 + absl::Seconds(40), 4, 4, false);
  EXPECT_DOUBLE_EQ(c.RegisteredSeconds(), 160);
  EXPECT_DOUBLE_EQ(c.Idle().idle_unqueued, 40);
  EXPECT_DOUBLE_EQ(c.Idle().idle_waiting, 20);
  EXPECT_EQ(c.since(), t0);
}

TEST_F(PreemptionTest, AFinishedJobsGoodputIsKeptAndTheClusterCountsIt) {
  StartManager(SharingOptions());
  AddWorker("w0");
  AddWorker("w1");
  const std::string id = SubmitAs("bob", Yaml("research"));
  AckAll({"w0", "w1"});
  ASSERT_EQ(Status(id).state(), v1::RUNNING);
  absl::SleepFor(absl::Milliseconds(300));
  v1::WorkerEvent m0 = testing::MetricsEvent("w0", id, 0, 40, 1.0);
  m0.mutable_metrics()->mutable_values()->erase("train_loss");  // the last stage's only
  (*m0.mutable_metrics()->mutable_values())["compute_seconds"] = 0.1;
  manager_->OnEvent(m0);
  v1::WorkerEvent m1 = testing::MetricsEvent("w1", id, 1, 40, 1.0);
  (*m1.mutable_metrics()->mutable_values())["compute_seconds"] = 0.1;
  manager_->OnEvent(m1);
  Sync();
  absl::StatusOr<v1::Goodput> live = manager_->Goodput(id);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_DOUBLE_EQ(live->productive_worker_seconds(), 0.2);
  EXPECT_GT(live->bubble_worker_seconds(), 0.3);  // 2 workers x >= 0.3 s running, less 0.2
  for (const std::string w : {"w0", "w1"}) {
    manager_->OnEvent(testing::ResultEvent(w, id, w == "w0" ? 0 : 1, 0.5));
  }
  Sync();
  ASSERT_EQ(Status(id).state(), v1::SUCCEEDED) << Status(id).reason();
  absl::StatusOr<v1::Goodput> ended = manager_->Goodput(id);  // from the store now
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_DOUBLE_EQ(ended->productive_worker_seconds(), 0.2);
  EXPECT_GE(ended->held_worker_seconds(), live->held_worker_seconds());
  EXPECT_NEAR(ended->goodput(),
              (ended->productive_worker_seconds() + ended->bubble_worker_seconds()) /
                  ended->held_worker_seconds(),
              1e-12);
  absl::StatusOr<v1::Goodput> cluster = manager_->Goodput("");
  ASSERT_TRUE(cluster.ok());
  EXPECT_DOUBLE_EQ(cluster->productive_worker_seconds(), 0.2);
  EXPECT_GT(cluster->registered_worker_seconds(), cluster->held_worker_seconds() * 0.99);
  EXPECT_GT(cluster->goodput(), 0);
  EXPECT_EQ(manager_->Goodput("job-none").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PreemptionTest, AWaitingJobMovesToAnotherClassARunningOneDoesNot) {
  StartManager(SharingOptions());
  AddWorker("w0");
  AddWorker("w1");
  const std::string running = SubmitAs("bob", Yaml("batch"));
  AckAll({"w0", "w1"});
  const std::string first = SubmitAs("dave", Yaml("batch"));
  const std::string second = SubmitAs("dave", Yaml("batch"));
  EXPECT_EQ(Status(first).queue_position(), 1);
  // Errors name the key; nothing changes.
  absl::StatusOr<v1::JobStatus> bad = manager_->SetPriority(second, "urgent");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("priority: unknown class 'urgent'"));
  bad = manager_->SetPriority(running, "research");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("priority: job " + running + " is RUNNING; the class of a placed job"));
  EXPECT_EQ(Status(running).priority(), "batch");
  EXPECT_EQ(manager_->SetPriority("job-none", "research").status().code(),
            absl::StatusCode::kNotFound);
  // research is above batch: the second job goes first now, and (research
  // preempts) takes the running batch job's workers.
  absl::StatusOr<v1::JobStatus> moved = manager_->SetPriority(second, "research");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->priority(), "research");
  Sync();
  EXPECT_EQ(Status(second).queue_position(), 1);
  EXPECT_EQ(Status(first).queue_position(), 2);
  EXPECT_EQ(Sink("w0").Of(v1::Command::kCheckpointSoon).size(), 1u);
  // Durable: the store has it.
  auto stored = store_->GetJob(second);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->status.priority(), "research");
}

TEST_F(PreemptionTest, AVictimThatMayRunSmallerResumesOnWhatIsLeft) {
  StartManager(SharingOptions());
  AddWorker("w0");
  AddWorker("w1");
  AddWorker("w2");
  // Three stages that may run on one (recovery.min_stages): stopping it
  // frees two workers, enough for the production job.
  const std::string low = SubmitAs(
      "bob", JobYaml(3, 40,
                     "priority: research\ncheckpoint: {dir: " + root_ +
                         ", every_steps: 1000}\nrecovery: {min_stages: 1, max_restarts: 3}\n"));
  AckAll({"w0", "w1", "w2"});
  ASSERT_EQ(Status(low).state(), v1::RUNNING);
  const std::string high = SubmitAs("alice", Yaml("production"));
  ASSERT_EQ(Sink("w0").Of(v1::Command::kCheckpointSoon).size(), 1u);
  v1::WorkerEvent planned;
  planned.set_worker_id("w0");
  planned.set_job_id(low);
  planned.mutable_checkpoint_planned()->set_step(5);
  manager_->OnEvent(planned);
  for (int j = 0; j < 3; ++j) Saved(low, "w" + std::to_string(j), j, 5);
  Sync();
  EXPECT_EQ(Status(high).state(), v1::CONFIGURING);
  const v1::JobStatus victim = Status(low);
  EXPECT_EQ(victim.state(), v1::CONFIGURING) << victim.reason();
  ASSERT_EQ(victim.attempts_size(), 2);
  EXPECT_EQ(victim.attempts(0).cause(), v1::END_CAUSE_PRIORITY);
  EXPECT_THAT(victim.attempts(0).end_reason(), HasSubstr("resuming on fewer workers"));
  EXPECT_EQ(victim.attempts(1).workers_size(), 1);
  EXPECT_EQ(victim.attempts(1).from_step(), 5);
  EXPECT_EQ(victim.num_stages(), 1);
}

}  // namespace
}  // namespace stagewise::coordinator
