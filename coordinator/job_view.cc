#include "coordinator/job_view.h"

#include "services/common/status_macros.h"

namespace stagewise::coordinator {

void JobStatusView::Publish(const v1::JobStatus& status, const std::string& message) {
  v1::JobEvent event;
  *event.mutable_status() = status;
  event.set_message(message);
  absl::MutexLock lock(&mu_);
  if (IsTerminal(status.state())) {
    live_.erase(status.job_id());
  } else {
    live_[status.job_id()] = status;
  }
  for (auto& [id, entry] : listeners_) {
    if (entry.first == status.job_id()) entry.second(event);
  }
}

std::optional<v1::JobStatus> JobStatusView::Find(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(job_id);
  if (it == live_.end()) return std::nullopt;
  return it->second;
}

void JobStatusView::Overlay(std::vector<v1::JobStatus>* jobs) const {
  absl::MutexLock lock(&mu_);
  for (v1::JobStatus& job : *jobs) {
    auto it = live_.find(job.job_id());
    if (it != live_.end()) job = it->second;
  }
}

int JobStatusView::CountOwnedBy(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  int live = 0;
  for (const auto& [id, st] : live_) live += st.owner() == owner ? 1 : 0;
  return live;
}

int64_t JobStatusView::AddListenerLocked(const std::string& job_id, const v1::JobStatus& first,
                                         Listener listener) {
  v1::JobEvent event;
  *event.mutable_status() = first;
  listener(event);
  const int64_t id = next_subscription_++;
  listeners_[id] = {job_id, std::move(listener)};
  return id;
}

absl::StatusOr<int64_t> JobStatusView::Subscribe(const std::string& job_id, Listener listener) {
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(job_id);
    if (it != live_.end()) return AddListenerLocked(job_id, it->second, std::move(listener));
  }
  // Not live: finished (its last event is its stored status) or unknown. The
  // store is read without the lock; the job may have become live meanwhile.
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  absl::MutexLock lock(&mu_);
  auto it = live_.find(job_id);
  return AddListenerLocked(job_id, it != live_.end() ? it->second : rec.status,
                           std::move(listener));
}

void JobStatusView::Unsubscribe(int64_t subscription) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(subscription);
}

}  // namespace stagewise::coordinator
