// What the coordinator's job units (JobRecovery, CheckpointCommitter) may ask
// of the manager that owns the live jobs: a narrow interface, so that they
// never call JobManager itself (no circle) and are unit-tested with a fake
// (tests/unit/coordinator_fakes.h, FakeJobHost).
//
// Threading: the loop thread only (or the Start caller before the loop runs).
// A LiveJob& stays valid until EndJob of that job: callers return right after
// EndJob, and collect ids before acting on several jobs.
#ifndef STAGEWISE_COORDINATOR_JOB_HOST_H_
#define STAGEWISE_COORDINATOR_JOB_HOST_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/live_job.h"
#include "coordinator/store.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class JobHost {
 public:
  virtual ~JobHost() = default;

  // The live job, or null.
  virtual LiveJob* FindJob(const std::string& job_id) = 0;
  // Every live job's id.
  virtual std::vector<std::string> LiveJobIds() const = 0;
  // Persists the new state (after the job's pending progress), publishes it.
  virtual absl::StatusOr<v1::JobStatus> Transition(const std::string& job_id, v1::JobState to,
                                                   const std::string& reason) = 0;
  // Ends a live job: persists `state`, stops its stages, frees its workers.
  // By value: callers pass strings the job owns, which ending it destroys.
  virtual void EndJob(std::string job_id, v1::JobState state, std::string reason) = 0;
  // Publishes a progress change now and writes it with the next flush.
  virtual void UpdateProgress(LiveJob& job, const std::string& message,
                              std::vector<MetricPoint> points) = 0;
  // Changes the job's status durably before the caller acts on it: the
  // pending progress is written first, then `change` applied and the status
  // written; on the store's error the status is as it was and the error is
  // returned.
  virtual absl::Status ChangeStatus(LiveJob& job,
                                    const std::function<void(v1::JobStatus&)>& change) = 0;
  // Frees the job's workers and tells each to stop its stage.
  virtual void StopStages(const std::string& job_id, const std::string& reason) = 0;
  // Puts the job back in the scheduler's queue (ahead of new jobs when
  // `recovering`); the loop schedules after the current task, never inside.
  virtual void Requeue(const std::string& job_id, bool recovering) = 0;
  // Sends a command to a worker (its id is set by the sender unless it has
  // one from NewCommandId).
  virtual void Send(const std::string& worker_id, v1::Command command) = 0;
  // An id for a command whose acknowledgement the caller waits for.
  virtual int64_t NewCommandId() = 0;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_JOB_HOST_H_
