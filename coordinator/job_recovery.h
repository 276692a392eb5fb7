// Fault tolerance of live jobs (docs/fault_tolerance.md): ends an attempt
// that lost a worker or hit a transient error, and queues the next one from
// the newest committed checkpoint (or from step 0), until
// recovery.max_restarts is spent; fails jobs that wait too long for workers
// and recovers those whose stages never acknowledged their assignment.
//
// It acts only through JobHost (no JobManager methods): unit-tested with a
// fake host (tests/unit/job_recovery_test.cc).
//
// Threading: the loop thread only (or the Start caller before the loop runs).
#ifndef STAGEWISE_COORDINATOR_JOB_RECOVERY_H_
#define STAGEWISE_COORDINATOR_JOB_RECOVERY_H_

#include <string>

#include "absl/time/time.h"
#include "coordinator/job_host.h"
#include "coordinator/live_job.h"
#include "services/metrics/metrics.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class JobRecovery {
 public:
  JobRecovery(JobHost* host, metrics::CoordinatorMetrics* metrics, absl::Duration configure_timeout)
      : host_(host), metrics_(metrics), configure_timeout_(configure_timeout) {}

  // Ends the running attempt of a job (stops its stages, frees its workers)
  // and queues the next one, or fails the job when recovery.max_restarts is
  // spent or nothing can be resumed. `cause` is the attempt's; its policy
  // says whether it counts as a restart.
  void Recover(const std::string& job_id, const std::string& why, v1::EndCause cause);
  // Chooses the checkpoint to resume from and requeues a RECOVERING job;
  // false if the job was failed instead.
  bool QueueRecovery(const std::string& job_id, LiveJob& job, const std::string& why);
  // Recovers RUNNING jobs past their stall limit (StallLimit), fails
  // RECOVERING jobs past recovery.wait_seconds and recovers CONFIGURING ones
  // past the configure timeout.
  void CheckDeadlines(absl::Time now);
  // A worker that no longer ran a stage was lost: the attempt that ended on
  // it within kLossWindow (its peers' broken streams reported first) gets
  // the loss as its cause.
  void NoteLostWorker(const std::string& worker_id, const std::string& why);
  static constexpr absl::Duration kLossWindow = absl::Seconds(10);
  // A stage's error (the current attempt's): a damaged resume shard skips its
  // checkpoint and recovers, a transient error recovers, anything else fails
  // the job.
  void OnStageError(const std::string& job_id, LiveJob& job, int stage,
                    const v1::StageError& error);
  // A stage's error from an attempt that has ended (`attempt`): when that
  // attempt's reason is a neighbour's broken stream (end_reason_secondary)
  // and this error is not one, this one is the cause and names the end.
  void NoteLateError(LiveJob& job, int attempt, const v1::StageError& error);
  // A new attempt is being configured: records it in the job's status and
  // fills the resume point of each StageAssignment in `commands` (one per
  // stage, in stage order).
  void BeginAttempt(LiveJob& job, std::vector<v1::Command>* commands);

 private:
  JobHost* const host_;
  metrics::CoordinatorMetrics* const metrics_;
  const absl::Duration configure_timeout_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_JOB_RECOVERY_H_
