// How a live job gets to workers (loop thread): the scheduling pass and what
// it places, the plan from the workers' profiles, the stage assignments,
// growing a shrunk job back (recovery.min_stages), and the queue a job goes
// back to, with what clients change in it (release from suspension, the
// priority class). Acts on the live jobs through JobHost (job_host.h), as
// JobRecovery does; JobManager owns one and hands it the parts it acts with.
#ifndef STAGEWISE_COORDINATOR_JOB_PLACEMENT_H_
#define STAGEWISE_COORDINATOR_JOB_PLACEMENT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/goodput_tracker.h"
#include "coordinator/job_host.h"
#include "coordinator/job_recovery.h"
#include "coordinator/live_job.h"
#include "coordinator/owner_usage.h"
#include "coordinator/planned_stop.h"
#include "coordinator/preemption.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"
#include "services/spec/sharing.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class JobPlacer {
 public:
  // What the placer acts with; every pointer outlives it.
  struct Parts {
    Scheduler* scheduler = nullptr;
    WorkerRegistry* registry = nullptr;
    JobRecovery* recovery = nullptr;  // an attempt begins when it is configured
    PlannedStops* planned = nullptr;  // growing is a planned stop
    Preemptor* preemptor = nullptr;   // after each pass
    OwnerUsage* usage = nullptr;      // who holds the placed workers
    GoodputTracker* goodput = nullptr;
    const SharingConfig* sharing = nullptr;  // an empty one: FIFO with backfill
    // How long a placed job's stages may take to acknowledge their
    // assignments, and how long a recovering job waits before it is placed
    // (JobManagerOptions).
    absl::Duration configure_timeout = absl::Seconds(120);
    absl::Duration recovery_settle = absl::Seconds(1);
    // True on the thread that owns the live jobs (JobManager's loop); every
    // public method checks it. Null: not checked.
    std::function<bool()> on_loop;
  };

  JobPlacer(JobHost* host, Parts parts) : host_(host), parts_(parts) {}

  // A pass is due (the queue or the idle workers changed); the loop runs
  // it after the current task, never inside one.
  void MarkNeeded() { needed_ = true; }
  void PassIfNeeded();
  // Places what the scheduler can (PROFILING or CONFIGURING), tells the
  // jobs still queued what they wait for and their place, lets waiting jobs
  // of a preempting class stop lower ones, and grows shrunk jobs while none
  // waits.
  void Pass();
  // recovery.min_stages: plans a stop of every running job that runs fewer
  // stages than stages.count when idle workers could take more (cause grow).
  void MaybeGrow();
  // Puts the job in the scheduler's queue (ahead of new jobs when
  // `recovering`); a suspended job stays outside it.
  void Requeue(const std::string& job_id, bool recovering);
  // A worker's profile of a PROFILING job: the plan once every profile is
  // in, then the stage assignments.
  void OnProfile(const std::string& job_id, const v1::ProfileResult& result,
                 const std::string& sender);
  // A suspended job queued, durably (FAILED_PRECONDITION when it is not
  // suspended).
  absl::StatusOr<v1::JobStatus> Release(const std::string& job_id, LiveJob& job);
  // A waiting job moved to class `priority`, durably (INVALID_ARGUMENT for
  // an unknown class, PERMISSION_DENIED for a class closed to its owner,
  // FAILED_PRECONDITION for a placed job).
  absl::StatusOr<v1::JobStatus> SetPriority(const std::string& job_id, LiveJob& job,
                                            const std::string& priority);

 private:
  // Sends every stage its StageAssignment (job.attempt.workers already chosen).
  void Configure(const std::string& job_id, LiveJob& job);
  // The placement `p` of the pass: the job's workers, its state.
  void Place(const Scheduler::Placement& p);

  bool OnLoop() const { return !parts_.on_loop || parts_.on_loop(); }

  JobHost* const host_;
  const Parts parts_;
  bool needed_ = false;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_JOB_PLACEMENT_H_
