// Planned stops (docs/fault_tolerance.md, "Preemption"): a running job is
// checkpointed at its next step boundary, then its attempt ends on purpose
// and the job resumes from that very checkpoint through JobRecovery, without
// spending recovery.max_restarts.
//
// 1. Begin: a CheckpointCommand goes to the worker of stage 0 (replica 0).
// 2. Stage 0 picks the step after the mini-batch it sends next and says so
//    (WorkerEvent.checkpoint_planned, OnPlanned); every stage learns the step
//    from StageMessage.checkpoint_step and writes its shard there.
// 3. When that checkpoint is committed (OnCommitted), the attempt ends with
//    the stop's cause (a planned one: END_CAUSE_PREEMPTED, _GROW, _REBALANCE)
//    and the job is queued to resume from it, with the stop's Handover.
// A plan that is not committed within kTimeout is dropped (CheckDeadlines):
// the job goes on; a preempted worker then simply leaves, a lost worker.
//
// It acts only through JobHost and JobRecovery: unit-tested with a fake host.
// Threading: the loop thread only.
#ifndef STAGEWISE_COORDINATOR_PLANNED_STOP_H_
#define STAGEWISE_COORDINATOR_PLANNED_STOP_H_

#include <string>

#include "absl/time/time.h"
#include "coordinator/job_host.h"
#include "coordinator/job_recovery.h"
#include "coordinator/live_job.h"

namespace stagewise::coordinator {

class PlannedStops {
 public:
  PlannedStops(JobHost* host, JobRecovery* recovery) : host_(host), recovery_(recovery) {}

  static constexpr absl::Duration kTimeout = absl::Seconds(120);

  // Asks for a checkpoint of the running job and a stop after it; the next
  // attempt takes `handover`. False (and nothing asked) when the job is not
  // RUNNING, keeps no checkpoints, or a stop is already planned.
  // `for_job`: END_CAUSE_PRIORITY's waiting job (JobAttempt.preempted_by).
  bool Begin(const std::string& job_id, LiveJob& job, const std::string& reason, v1::EndCause cause,
             Handover handover = {}, std::string for_job = "");
  // Stage 0 picked the step.
  void OnPlanned(LiveJob& job, int64_t step);
  // Called after every shard report: ends the attempt once the planned
  // checkpoint is committed.
  void OnCommitted(const std::string& job_id, LiveJob& job);
  void CheckDeadlines(absl::Time now);

 private:
  JobHost* const host_;
  JobRecovery* const recovery_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_PLANNED_STOP_H_
