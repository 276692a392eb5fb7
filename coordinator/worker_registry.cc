#include "coordinator/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stagewise::coordinator {

absl::StatusOr<std::string> WorkerRegistry::Register(const v1::WorkerInfo& info, absl::Time now,
                                                     std::optional<Removed>* replaced) {
  if (info.address().empty()) {
    return absl::InvalidArgumentError("WorkerInfo.address: empty");
  }
  const std::string id = info.worker_id().empty() ? info.address() : info.worker_id();
  absl::MutexLock lock(&mu_);
  replaced->reset();
  if (auto it = workers_.find(id); it != workers_.end()) {
    // The same worker came back (restart): its old stream and job are gone.
    *replaced = Removed{id, it->second.job_id, it->second.stage};
    if (it->second.sink != nullptr) {
      it->second.sink->Close(absl::AbortedError("replaced by a new registration"));
    }
    workers_.erase(it);
  }
  Worker& w = workers_[id];
  w.info = info;
  w.info.set_worker_id(id);
  w.last_seen = now;
  return id;
}

absl::Status WorkerRegistry::Connect(const std::string& worker_id, CommandSink* sink,
                                     absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("WorkerEvent.worker_id: '", worker_id, "' is not registered"));
  }
  it->second.sink = sink;
  it->second.last_seen = now;
  return absl::OkStatus();
}

std::optional<WorkerRegistry::Removed> WorkerRegistry::Disconnect(const std::string& worker_id,
                                                                  CommandSink* sink) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.sink != sink) return std::nullopt;
  Removed removed{worker_id, it->second.job_id, it->second.stage};
  workers_.erase(it);
  return removed;
}

bool WorkerRegistry::Touch(const std::string& worker_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return false;
  it->second.last_seen = std::max(it->second.last_seen, now);
  return true;
}

std::vector<WorkerRegistry::Removed> WorkerRegistry::Expire(absl::Time now,
                                                            absl::Duration timeout) {
  std::vector<Removed> out;
  absl::MutexLock lock(&mu_);
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (now - it->second.last_seen <= timeout) {
      ++it;
      continue;
    }
    out.push_back({it->first, it->second.job_id, it->second.stage});
    if (it->second.sink != nullptr) {
      it->second.sink->Close(absl::UnavailableError("missed heartbeats"));
    }
    it = workers_.erase(it);
  }
  return out;
}

absl::Time WorkerRegistry::NextExpiry(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  absl::Time first = absl::InfiniteFuture();
  for (const auto& [id, w] : workers_) first = std::min(first, w.last_seen + timeout);
  return first;
}

WorkerRegistry::Counts WorkerRegistry::GetCounts() const {
  absl::MutexLock lock(&mu_);
  Counts counts;
  counts.registered = static_cast<int>(workers_.size());
  for (const auto& [id, w] : workers_) {
    if (!w.job_id.empty()) {
      ++counts.busy;
    } else if (w.sink != nullptr) {
      ++counts.idle;
    }
  }
  return counts;
}

std::vector<std::string> WorkerRegistry::Claim(const std::string& job_id, int n) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> chosen;
  for (const auto& [id, w] : workers_) {
    if (static_cast<int>(chosen.size()) == n) break;
    if (w.sink != nullptr && w.job_id.empty()) chosen.push_back(id);
  }
  if (static_cast<int>(chosen.size()) < n) return {};
  for (size_t j = 0; j < chosen.size(); ++j) {
    Worker& w = workers_[chosen[j]];
    w.job_id = job_id;
    w.stage = static_cast<int>(j);
  }
  return chosen;
}

std::vector<std::string> WorkerRegistry::Release(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> freed;
  for (auto& [id, w] : workers_) {
    if (w.job_id != job_id) continue;
    w.job_id.clear();
    w.stage = -1;
    freed.push_back(id);
  }
  return freed;
}

std::optional<v1::WorkerInfo> WorkerRegistry::Info(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  return it->second.info;
}

bool WorkerRegistry::Send(const std::string& worker_id, const v1::Command& command) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.sink == nullptr) return false;
  return it->second.sink->Send(command);
}

std::vector<v1::WorkerInfo> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  out.reserve(workers_.size());
  for (const auto& [id, w] : workers_) {
    v1::WorkerInfo info = w.info;
    auto& labels = *info.mutable_labels();
    labels["state"] = w.sink == nullptr ? "registering" : (w.job_id.empty() ? "idle" : "busy");
    if (!w.job_id.empty()) {
      labels["job"] = w.job_id;
      labels["stage"] = std::to_string(w.stage);
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace stagewise::coordinator
