#include "coordinator/owner_usage.h"

#include <cmath>

namespace stagewise::coordinator {

void OwnerUsage::Advance(Owner& owner, absl::Time now) const {
  if (owner.since == absl::InfinitePast()) {
    owner.since = now;
    return;
  }
  const double dt = std::max(0.0, absl::ToDoubleSeconds(now - owner.since));
  owner.since = std::max(owner.since, now);
  if (dt == 0) return;
  owner.worker_seconds += owner.held * dt;
  // d/dt U = held - U ln2 / h: the decayed sum of a constant `held` over dt.
  const double h = absl::ToDoubleSeconds(half_life_);
  const double keep = std::exp2(-dt / h);
  owner.decayed = owner.decayed * keep + owner.held * h / std::log(2.0) * (1 - keep);
  owner.decayed_gpu = owner.decayed_gpu * keep + owner.held_gpu * h / std::log(2.0) * (1 - keep);
}

OwnerUsage::Owner OwnerUsage::AdvancedCopy(const std::string& owner, absl::Time now) const {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return {};
  Owner copy = it->second;
  Advance(copy, now);
  return copy;
}

void OwnerUsage::Hold(const std::string& job_id, const std::string& owner, int workers,
                      absl::Time now, int gpu_workers) {
  Release(job_id, now);
  Owner& o = owners_[owner];
  Advance(o, now);
  o.held += workers;
  o.held_gpu += gpu_workers;
  o.jobs += 1;
  jobs_[job_id] = {owner, workers, gpu_workers};
}

void OwnerUsage::Release(const std::string& job_id, absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Owner& o = owners_[it->second.owner];
  Advance(o, now);
  o.held -= it->second.workers;
  o.held_gpu -= it->second.gpu_workers;
  o.jobs -= 1;
  jobs_.erase(it);
}

int OwnerUsage::HeldWorkers(const std::string& owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.held;
}

int OwnerUsage::HeldGpuWorkers(const std::string& owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.held_gpu;
}

double OwnerUsage::DecayedGpuWorkerSeconds(const std::string& owner, absl::Time now) const {
  return AdvancedCopy(owner, now).decayed_gpu;
}

int OwnerUsage::HeldJobs(const std::string& owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.jobs;
}

int OwnerUsage::TotalHeld() const {
  int total = 0;
  for (const auto& [name, o] : owners_) total += o.held;
  return total;
}

double OwnerUsage::WorkerSeconds(const std::string& owner, absl::Time now) const {
  return AdvancedCopy(owner, now).worker_seconds;
}

double OwnerUsage::DecayedWorkerSeconds(const std::string& owner, absl::Time now) const {
  return AdvancedCopy(owner, now).decayed;
}

std::map<std::string, double> OwnerUsage::AllWorkerSeconds(absl::Time now) const {
  std::map<std::string, double> all;
  for (const auto& [name, o] : owners_) all[name] = AdvancedCopy(name, now).worker_seconds;
  return all;
}

}  // namespace stagewise::coordinator
