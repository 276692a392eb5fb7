#include "coordinator/goodput_tracker.h"

#include <algorithm>

namespace stagewise::coordinator {
namespace {

// Wall seconds of the attempt's replacements until the job ran at full
// speed again (recovery.replay).
double ReplacementSeconds(const LiveJob& job) {
  if (job.status.attempts_size() == 0) return 0;
  double seconds = 0;
  for (const v1::StageReplacement& r : job.status.attempts().rbegin()->replacements()) {
    seconds += std::max(0.0, r.full_speed_seconds());
  }
  return seconds;
}

// What the running attempt has used so far, or up to its end.
WorkerSecondsByUse AttemptSoFar(const LiveJob& job, absl::Time now, double redone_seconds) {
  return job.attempt.use.Close(now, NumReplicas(job), ReplacementSeconds(job), redone_seconds);
}

// The demand of a job still waiting: the workers it asks for x its wait.
WorkerSecondsByUse WaitingSoFar(const LiveJob& job, absl::Time now) {
  WorkerSecondsByUse waiting;
  if (job.queued_since != absl::InfiniteFuture()) {
    waiting.queued = NumWorkerStages(job) * SpecReplicas(job) *
                     std::max(0.0, absl::ToDoubleSeconds(now - job.queued_since));
  }
  return waiting;
}

}  // namespace

void GoodputTracker::Queued(LiveJob& job, absl::Time now) {
  if (job.queued_since == absl::InfiniteFuture()) job.queued_since = now;
}

void GoodputTracker::Placed(LiveJob& job, int workers, absl::Time now) {
  Dequeued(job, now);  // the wait ends: it counts as demand
  job.attempt.use.Placed(workers, now);
  WriteUse(job.used, job.status.mutable_summary());
}

void GoodputTracker::Dequeued(LiveJob& job, absl::Time now) {
  const WorkerSecondsByUse waited = WaitingSoFar(job, now);
  job.used += waited;
  cluster_.AddEnded(waited);
  job.queued_since = absl::InfiniteFuture();
  WriteUse(job.used, job.status.mutable_summary());
}

void GoodputTracker::AttemptEnded(LiveJob& job, absl::Time now, bool redo) {
  if (!job.attempt.use.placed()) return;
  double redone = 0;
  if (redo) {
    const int64_t past =
        std::max<int64_t>(0, job.status.step() - job.status.last_checkpoint_step());
    redone = static_cast<double>(past) * job.median_step_seconds;
  }
  const WorkerSecondsByUse ended = AttemptSoFar(job, now, redone);
  job.used += ended;
  cluster_.AddEnded(ended);
  job.attempt.use = AttemptUse{};
  WriteUse(job.used, job.status.mutable_summary());
}

WorkerSecondsByUse GoodputTracker::JobUse(const LiveJob& job, absl::Time now) const {
  WorkerSecondsByUse use = job.used;
  if (job.attempt.use.placed()) use += AttemptSoFar(job, now, 0);
  use += WaitingSoFar(job, now);
  return use;
}

v1::Goodput GoodputTracker::Cluster(const std::vector<const LiveJob*>& live, absl::Time now) const {
  WorkerSecondsByUse use = cluster_.Ended();
  for (const LiveJob* job : live) {
    if (job->attempt.use.placed()) use += AttemptSoFar(*job, now, 0);
    use += WaitingSoFar(*job, now);
  }
  use += cluster_.Idle();
  v1::Goodput g = ToProto(use);
  g.set_registered_worker_seconds(cluster_.RegisteredSeconds());
  const double worked = cluster_.RegisteredSeconds() - use.idle_unqueued;
  g.set_goodput(worked > 0 ? (use.productive + use.bubble) / worked : 0);
  if (cluster_.since() != absl::InfinitePast()) {
    g.set_since_unix_ms(absl::ToUnixMillis(cluster_.since()));
  }
  return g;
}

}  // namespace stagewise::coordinator
