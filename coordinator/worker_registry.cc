#include "coordinator/worker_registry.h"

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "services/common/version.h"

namespace stagewise::coordinator {

namespace {

// 128 random bits, hex: unguessable by another client.
std::string NewSession() {
  std::random_device device;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&out, absl::Hex(device(), absl::kZeroPad8));
  return out;
}

// Equal strings, in time that depends only on the lengths.
bool SecretEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status CheckText(const std::string& field, const std::string& value, size_t max) {
  if (value.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value.size(), " bytes; at most ", max));
  }
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": control characters are not allowed"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInfo(const v1::WorkerInfo& info) {
  // Another protocol's events would be misread (a v1 worker names its job
  // inside each event, v2 on the envelope), and a v2 worker's stage streams
  // do not open the way a v3 worker expects; a v3 worker reads schedules
  // and block modes as text.
  if (info.protocol() != v1::CONTROL_PROTOCOL_V6) {
    return absl::FailedPreconditionError(
        absl::StrCat("WorkerInfo.protocol: the worker speaks control protocol ", info.protocol(),
                     ", this coordinator ", v1::CONTROL_PROTOCOL_V6,
                     ": run the same stagewise version on the coordinator and the workers"));
  }
  if (info.address().empty()) return absl::InvalidArgumentError("WorkerInfo.address: empty");
  STAGEWISE_RETURN_IF_ERROR(CheckText("WorkerInfo.worker_id", info.worker_id(), 128));
  STAGEWISE_RETURN_IF_ERROR(CheckText("WorkerInfo.address", info.address(), 256));
  STAGEWISE_RETURN_IF_ERROR(CheckText("WorkerInfo.device", info.device(), 64));
  STAGEWISE_RETURN_IF_ERROR(CheckText("WorkerInfo.version", info.version(), 64));
  STAGEWISE_RETURN_IF_ERROR(
      CheckPeerVersion(info.version(), absl::StrCat("the worker ", info.worker_id())));
  if (info.labels_size() > 32) {
    return absl::InvalidArgumentError("WorkerInfo.labels: at most 32 labels");
  }
  for (const auto& [key, value] : info.labels()) {
    STAGEWISE_RETURN_IF_ERROR(CheckText("WorkerInfo.labels key", key, 64));
    STAGEWISE_RETURN_IF_ERROR(CheckText(absl::StrCat("WorkerInfo.labels[", key, "]"), value, 256));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WorkerRegistry::Register(const v1::WorkerInfo& info,
                                                     const Caller& caller, absl::Time now,
                                                     std::optional<Removed>* replaced,
                                                     std::string* session) {
  STAGEWISE_RETURN_IF_ERROR(CheckInfo(info));
  const std::string id = info.worker_id().empty() ? info.address() : info.worker_id();
  absl::MutexLock lock(&mu_);
  replaced->reset();
  if (auto it = workers_.find(id); it != workers_.end()) {
    if (it->second.sink != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker '", id,
          "' is registered and its control stream is open; a worker that restarted may register "
          "again once that stream closes or misses its heartbeats"));
    }
    // The same worker came back before its stream opened: its old entry goes.
    *replaced = Removed{id, it->second.job_id, it->second.stage, it->second.replica};
    workers_.erase(it);
  } else if (workers_.size() >= kMaxWorkers) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the coordinator keeps at most ", kMaxWorkers, " workers"));
  }
  Worker& w = workers_[id];
  w.info = info;
  w.info.set_worker_id(id);
  w.last_seen = now;
  w.identity = caller.identity;
  w.session = NewSession();
  *session = w.session;
  return id;
}

absl::Status WorkerRegistry::Connect(const std::string& worker_id, const std::string& session,
                                     const Caller& caller, CommandSink* sink, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("WorkerEvent.worker_id: '", worker_id, "' is not registered"));
  }
  if (!SecretEquals(session, it->second.session) || caller.identity != it->second.identity) {
    return absl::PermissionDeniedError(
        absl::StrCat("WorkerEvent.session: not the registration of '", worker_id,
                     "' (a control stream is opened by the worker that registered, with the "
                     "session RegisterWorker returned)"));
  }
  if (it->second.sink != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker '", worker_id, "' has a control stream open already"));
  }
  it->second.sink = sink;
  it->second.last_seen = now;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckSession(const std::string& worker_id, const std::string& session,
                                          const Caller& caller) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker_id: '", worker_id, "' is not registered"));
  }
  if (!SecretEquals(session, it->second.session) || caller.identity != it->second.identity) {
    return absl::PermissionDeniedError(
        absl::StrCat("session: not the registration of '", worker_id, "'"));
  }
  return absl::OkStatus();
}

std::optional<WorkerRegistry::Removed> WorkerRegistry::Disconnect(const std::string& worker_id,
                                                                  CommandSink* sink) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.sink != sink) return std::nullopt;
  Removed removed{worker_id, it->second.job_id, it->second.stage, it->second.replica};
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
    out.push_back({it->first, it->second.job_id, it->second.stage, it->second.replica});
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
    if (HasLabels(w.info, {kNeedsCudaLabel})) ++counts.gpu;
    if (!w.job_id.empty()) {
      ++counts.busy;
    } else if (w.sink != nullptr && !w.draining) {
      ++counts.idle;
    }
  }
  return counts;
}

bool HasLabels(const v1::WorkerInfo& info, const std::vector<std::string>& labels) {
  for (const std::string& label : labels) {
    const size_t eq = label.find('=');
    if (eq == std::string::npos) return false;
    if (label == kNeedsCudaLabel) {
      if (info.device() != "cuda" && !absl::StartsWith(info.device(), "cuda:")) return false;
      continue;
    }
    auto it = info.labels().find(label.substr(0, eq));
    if (it == info.labels().end() || it->second != label.substr(eq + 1)) return false;
  }
  return true;
}

int WorkerRegistry::IdleWith(const std::vector<std::string>& labels) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, w] : workers_) {
    n += w.sink != nullptr && w.job_id.empty() && !w.draining && HasLabels(w.info, labels);
  }
  return n;
}

std::vector<std::string> WorkerRegistry::Claim(const std::string& job_id, int n,
                                               bool distinct_identities, int stages,
                                               const std::vector<std::string>& labels) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> chosen;
  std::set<std::string> identities;
  for (const auto& [id, w] : workers_) {
    if (static_cast<int>(chosen.size()) == n) break;
    if (w.sink == nullptr || !w.job_id.empty() || w.draining) continue;
    if (!HasLabels(w.info, labels)) continue;  // placement.labels
    if (distinct_identities && !w.identity.empty() && !identities.insert(w.identity).second) {
      continue;  // this certificate holds a stage of the job already
    }
    chosen.push_back(id);
  }
  if (static_cast<int>(chosen.size()) < n) return {};
  const int J = stages > 0 ? stages : n;
  for (size_t slot = 0; slot < chosen.size(); ++slot) {
    Worker& w = workers_[chosen[slot]];
    w.job_id = job_id;
    w.stage = static_cast<int>(slot) % J;
    w.replica = n > J ? static_cast<int>(slot) / J : -1;
  }
  return chosen;
}

std::string WorkerRegistry::ClaimOne(const std::string& job_id, int stage,
                                     const std::vector<std::string>& labels,
                                     const std::set<std::string>& taken) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : workers_) {
    if (w.sink == nullptr || !w.job_id.empty() || w.draining) continue;
    if (!HasLabels(w.info, labels)) continue;
    if (!w.identity.empty() && taken.count(w.identity) > 0) continue;
    w.job_id = job_id;
    w.stage = stage;
    w.replica = -1;
    return id;
  }
  return "";
}

std::vector<std::string> WorkerRegistry::Release(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> freed;
  for (auto& [id, w] : workers_) {
    if (w.job_id != job_id) continue;
    w.job_id.clear();
    w.stage = -1;
    w.replica = -1;
    freed.push_back(id);
  }
  return freed;
}

std::optional<std::string> WorkerRegistry::MarkDraining(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  it->second.draining = true;
  return it->second.job_id;
}

std::string WorkerRegistry::Identity(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? "" : it->second.identity;
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
    labels["state"] = w.sink == nullptr ? "registering"
                      : w.draining      ? "draining"
                                        : (w.job_id.empty() ? "idle" : "busy");
    if (!w.job_id.empty()) {
      labels["job"] = w.job_id;
      labels["stage"] = std::to_string(w.stage);
      if (w.replica >= 0) labels["replica"] = std::to_string(w.replica);
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::map<std::string, absl::Time> WorkerRegistry::LastSeen() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, absl::Time> out;
  for (const auto& [id, w] : workers_) out.emplace(id, w.last_seen);
  return out;
}

}  // namespace stagewise::coordinator
