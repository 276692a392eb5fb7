// JobPlacer (coordinator/job_placement.h) through a fake JobHost: what goes
// into the scheduler's queue, and what clients change in it (release from
// suspension, the priority class), durably before it acts.
#include "coordinator/job_placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <string>

#include "coordinator/job_recovery.h"
#include "coordinator/owner_usage.h"
#include "coordinator/planned_stop.h"
#include "coordinator/preemption.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"
#include "services/metrics/metrics.h"
#include "services/spec/job_spec.h"
#include "tests/unit/fake_job_host.h"

namespace stagewise::coordinator {
namespace {

using testing::FakeJobHost;
using ::testing::HasSubstr;

class JobPlacerTest : public ::testing::Test {
 protected:
  JobPlacerTest() : metrics_(registry_), recovery_(&host_, &metrics_, absl::Seconds(30)) {
    auto sharing = ParseSharingConfig(R"(
classes:
  - name: production
    owners: [alice]
  - name: research
default_class: research
)");
    EXPECT_TRUE(sharing.ok()) << sharing.status();
    if (sharing.ok()) sharing_ = *sharing;
    scheduler_.SetSharing(&sharing_, &usage_);
  }

  // A job waiting to be placed, owned by `owner`.
  LiveJob& Waiting(const std::string& id, const std::string& owner, bool suspended) {
    auto spec = ParseJobSpec(R"(name: placed
model: {name: revnet, depth: 18, width: 4}
data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [3, 8, 8], classes: 4}
algorithm: backprop
stages: 2
optimizer: {name: sgd, lr: 0.05}
batch_size: 16
steps: 4
)");
    EXPECT_TRUE(spec.ok()) << spec.status();
    LiveJob& job = host_.jobs[id];
    if (spec.ok()) job.spec = *spec;
    job.status.set_job_id(id);
    job.status.set_state(v1::PENDING);
    job.status.set_owner(owner);
    job.status.set_priority("research");
    job.status.set_suspended(suspended);
    job.cut.ranges = {{0, 2}, {2, 4}};
    return job;
  }

  prometheus::Registry registry_;
  metrics::CoordinatorMetrics metrics_;
  FakeJobHost host_;
  JobRecovery recovery_;
  WorkerRegistry workers_;
  Scheduler scheduler_{&workers_};
  PlannedStops planned_{&host_, &recovery_};
  Preemptor preemptor_{&host_, &planned_, &workers_};
  OwnerUsage usage_;
  GoodputTracker goodput_;
  SharingConfig sharing_;
  JobPlacer placer_{&host_,
                    {&scheduler_, &workers_, &recovery_, &planned_, &preemptor_, &usage_, &goodput_,
                     &sharing_, absl::Seconds(30), absl::Seconds(1), nullptr}};
};

TEST_F(JobPlacerTest, ASuspendedJobStaysOutOfTheQueueUntilReleasedDurably) {
  LiveJob& job = Waiting("job-1", "bob", /*suspended=*/true);
  placer_.Requeue("job-1", /*recovering=*/false);
  EXPECT_FALSE(scheduler_.Queued("job-1"));

  // The store is down: nothing changes, nothing is queued.
  host_.fail_transitions = true;
  EXPECT_EQ(placer_.Release("job-1", job).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(job.status.suspended());
  EXPECT_FALSE(scheduler_.Queued("job-1"));

  host_.fail_transitions = false;
  absl::StatusOr<v1::JobStatus> released = placer_.Release("job-1", job);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_FALSE(released->suspended());
  ASSERT_EQ(host_.persisted.size(), 1u);  // written before it was queued
  EXPECT_FALSE(host_.persisted[0].suspended());
  EXPECT_TRUE(scheduler_.Queued("job-1"));

  absl::StatusOr<v1::JobStatus> again = placer_.Release("job-1", job);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("not suspended"));
}

TEST_F(JobPlacerTest, APriorityChangeIsCheckedThenWrittenBeforeTheQueueMoves) {
  LiveJob& job = Waiting("job-1", "bob", /*suspended=*/false);
  placer_.Requeue("job-1", /*recovering=*/false);
  ASSERT_TRUE(scheduler_.Queued("job-1"));

  EXPECT_EQ(placer_.SetPriority("job-1", job, "urgent").status().code(),
            absl::StatusCode::kInvalidArgument);
  // production is alice's only.
  EXPECT_EQ(placer_.SetPriority("job-1", job, "production").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(host_.persisted.empty());
  EXPECT_EQ(job.status.priority(), "research");

  job.status.set_owner("alice");
  host_.fail_transitions = true;
  EXPECT_FALSE(placer_.SetPriority("job-1", job, "production").ok());
  EXPECT_EQ(job.status.priority(), "research");
  host_.fail_transitions = false;
  absl::StatusOr<v1::JobStatus> moved = placer_.SetPriority("job-1", job, "production");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->priority(), "production");
  ASSERT_EQ(host_.persisted.size(), 1u);
  EXPECT_EQ(host_.persisted[0].priority(), "production");
  EXPECT_THAT(host_.progress.back(), HasSubstr("research -> production"));

  // A placed job keeps its class.
  job.attempt.workers = {"w0", "w1"};
  absl::StatusOr<v1::JobStatus> placed = placer_.SetPriority("job-1", job, "research");
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(placed.status().message(), HasSubstr("does not change under it"));
}

TEST_F(JobPlacerTest, WithNoIdleWorkersAPassSaysWhatEachJobWaitsForAndItsPlace) {
  Waiting("job-1", "bob", false);
  Waiting("job-2", "carol", false);
  placer_.Requeue("job-1", false);
  placer_.Requeue("job-2", false);
  placer_.PassIfNeeded();
  for (const char* id : {"job-1", "job-2"}) {
    const v1::JobStatus& st = host_.jobs.at(id).status;
    EXPECT_THAT(st.reason(), HasSubstr("worker")) << id;
  }
  EXPECT_EQ(host_.jobs.at("job-1").status.queue_position(), 1);
  EXPECT_EQ(host_.jobs.at("job-2").status.queue_position(), 2);
  EXPECT_TRUE(host_.sent.empty());
  EXPECT_TRUE(host_.transitions.empty());
}

}  // namespace
}  // namespace stagewise::coordinator
