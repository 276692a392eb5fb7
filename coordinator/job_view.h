// The coordinator's published view of its live jobs' statuses, and the
// watchers of each job. The loop thread publishes every change (Publish);
// client threads read it (Find, Overlay, CountOwnedBy) and subscribe.
//
// Threading: every method is thread-safe (one leaf mutex, mu_). Listeners run
// under mu_ (on the publishing thread, or on the subscriber's for the first
// event): they must not block nor call back into the view. The store is never
// called under mu_.
#ifndef STAGEWISE_COORDINATOR_JOB_VIEW_H_
#define STAGEWISE_COORDINATOR_JOB_VIEW_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/store.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class JobStatusView {
 public:
  using Listener = std::function<void(const v1::JobEvent&)>;

  explicit JobStatusView(const JobStore* store) : store_(store) {}

  // A live job's new status (a terminal one removes it from the view), sent
  // to its watchers with `message`.
  void Publish(const v1::JobStatus& status, const std::string& message) ABSL_LOCKS_EXCLUDED(mu_);

  // The live job's status, if it is live.
  std::optional<v1::JobStatus> Find(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the statuses of live jobs in `jobs` by their newer view.
  void Overlay(std::vector<v1::JobStatus>* jobs) const ABSL_LOCKS_EXCLUDED(mu_);
  // How many live jobs `owner` has.
  int CountOwnedBy(const std::string& owner) const ABSL_LOCKS_EXCLUDED(mu_);

  // The listener gets the current status at once (a finished job's stored
  // one), then every change. NOT_FOUND for an unknown job.
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id, Listener listener)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unsubscribe(int64_t subscription) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  int64_t AddListenerLocked(const std::string& job_id, const v1::JobStatus& first,
                            Listener listener) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobStore* const store_;
  mutable absl::Mutex mu_;
  std::map<std::string, v1::JobStatus> live_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::pair<std::string, Listener>> listeners_ ABSL_GUARDED_BY(mu_);
  int64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_JOB_VIEW_H_
