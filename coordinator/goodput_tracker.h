// The coordinator's goodput bookkeeping (coordinator/goodput.h): the moments
// of a job's life it counts from (queued, placed, running, attempt ended),
// the cluster's idle time, and the totals `stagewise goodput` and the
// Prometheus series show.
//
// Threading: not thread-safe; the JobManager's loop thread only.
#ifndef STAGEWISE_COORDINATOR_GOODPUT_TRACKER_H_
#define STAGEWISE_COORDINATOR_GOODPUT_TRACKER_H_

#include <vector>

#include "absl/time/time.h"
#include "coordinator/goodput.h"
#include "coordinator/live_job.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class GoodputTracker {
 public:
  // The job waits in the queue from `now` (PENDING, or RECOVERING).
  void Queued(LiveJob& job, absl::Time now);
  // Placed on `workers`: its wait ends (as demand: the workers it asked for
  // x the time), its attempt's count begins.
  void Placed(LiveJob& job, int workers, absl::Time now);
  void Running(LiveJob& job, absl::Time now) { job.attempt.use.Running(now); }
  // The job leaves the queue without a placement (cancelled, failed): its
  // wait still counts as demand.
  void Dequeued(LiveJob& job, absl::Time now);
  // The attempt ends at `now`; with `redo` the steps it ran past the
  // checkpoint the job resumes from count as recovery. Its count joins the
  // job's (JobStatus.summary goodput.*) and the cluster's.
  void AttemptEnded(LiveJob& job, absl::Time now, bool redo);
  // The job's worker-seconds so far, its running attempt's included.
  WorkerSecondsByUse JobUse(const LiveJob& job, absl::Time now) const;
  // The pool from `now` on: registered and held workers, whether a job waits.
  void Tick(absl::Time now, int registered, int held, bool waiting) {
    cluster_.Tick(now, registered, held, waiting);
  }
  // The cluster's since the first tick: the ended attempts', the live jobs'
  // so far (`live`), the idle time (ticked up to `now` by the caller).
  v1::Goodput Cluster(const std::vector<const LiveJob*>& live, absl::Time now) const;

 private:
  ClusterUse cluster_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_GOODPUT_TRACKER_H_
