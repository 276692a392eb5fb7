// The coordinator's read-only queries: a job's status, the job list, a job's
// committed checkpoints, metric history and pipeline timeline. They read the
// store (finished jobs) and the published view (live jobs' newest progress);
// they never touch the loop thread's state.
//
// Threading: callable from any thread at once (the store and the view lock
// for themselves); never called under the view's mutex (listeners must not
// query).
#ifndef STAGEWISE_COORDINATOR_JOB_QUERIES_H_
#define STAGEWISE_COORDINATOR_JOB_QUERIES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_view.h"
#include "coordinator/store.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class JobQueries {
 public:
  JobQueries(const JobStore* store, const JobStatusView* view) : store_(store), view_(view) {}

  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id) const;
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(int limit) const;
  // One page (JobStore::ListJobsPage), live jobs' progress overlaid.
  absl::StatusOr<JobStore::JobPage> ListJobsPage(int page_size, const std::string& page_token,
                                                 size_t max_bytes) const;
  // Newest first, read from the job's checkpoint.dir (the coordinator must
  // reach it); NOT_FOUND for an unknown job, none without checkpoint.dir.
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(const std::string& job_id) const;
  // The job's event log: its submission, every transition and note, oldest
  // first (ListJobEventsRequest); NOT_FOUND for an unknown job.
  absl::StatusOr<v1::ListJobEventsResponse> JobEvents(const std::string& job_id) const;
  // At most `max_points` per metric (<= 0: 5000), evenly thinned.
  absl::StatusOr<v1::JobMetrics> JobMetrics(const std::string& job_id,
                                            const std::vector<std::string>& names,
                                            int max_points) const;
  // The stored spans by stage and attempt, on the coordinator's clock.
  absl::StatusOr<v1::JobTrace> JobTrace(const std::string& job_id) const;

 private:
  const JobStore* const store_;
  const JobStatusView* const view_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_JOB_QUERIES_H_
