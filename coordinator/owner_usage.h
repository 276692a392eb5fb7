// Who holds the pool's workers, and how much each owner used them: the
// numbers quotas and weighted fair share are decided on (docs/operations.md,
// "Sharing the cluster").
//
// A job holds its workers from its placement to the end of its attempt
// (Hold, Release). Each owner's use is integrated exactly between those
// moments: `worker_seconds` in full, and a decayed sum (half-life from the
// scheduling config) that the fair-share order compares, so that what an
// owner used a day ago weighs little against what it uses now.
//
// Threading: not thread-safe; the JobManager's loop thread only.
#ifndef STAGEWISE_COORDINATOR_OWNER_USAGE_H_
#define STAGEWISE_COORDINATOR_OWNER_USAGE_H_

#include <map>
#include <string>

#include "absl/time/time.h"

namespace stagewise::coordinator {

class OwnerUsage {
 public:
  explicit OwnerUsage(absl::Duration half_life = absl::Hours(1)) : half_life_(half_life) {}
  void set_half_life(absl::Duration half_life) { half_life_ = half_life; }

  // The job (of `owner`) holds `workers` from `now`, `gpu_workers` of them
  // on CUDA devices; a job already held is released first.
  void Hold(const std::string& job_id, const std::string& owner, int workers, absl::Time now,
            int gpu_workers = 0);
  // The job holds nothing from `now` (no-op when it held nothing).
  void Release(const std::string& job_id, absl::Time now);

  int HeldWorkers(const std::string& owner) const;
  int HeldJobs(const std::string& owner) const;
  // Workers held by every owner together.
  int TotalHeld() const;
  // Worker-seconds the owner's jobs held, up to `now`.
  double WorkerSeconds(const std::string& owner, absl::Time now) const;
  // The same with every past second weighted 2^(-age / half-life).
  double DecayedWorkerSeconds(const std::string& owner, absl::Time now) const;
  // The decayed worker-seconds of the owner's GPU workers alone.
  double DecayedGpuWorkerSeconds(const std::string& owner, absl::Time now) const;
  int HeldGpuWorkers(const std::string& owner) const;
  // Every owner seen, with its worker-seconds up to `now`.
  std::map<std::string, double> AllWorkerSeconds(absl::Time now) const;

 private:
  struct Owner {
    int held = 0;
    int held_gpu = 0;
    int jobs = 0;
    double worker_seconds = 0;  // up to `since`
    double decayed = 0;         // up to `since`
    double decayed_gpu = 0;     // up to `since`
    absl::Time since = absl::InfinitePast();
  };
  // Brings the owner's sums up to `now` (its `held` constant since `since`).
  void Advance(Owner& owner, absl::Time now) const;
  Owner AdvancedCopy(const std::string& owner, absl::Time now) const;

  absl::Duration half_life_;
  std::map<std::string, Owner> owners_;
  struct Held {
    std::string owner;
    int workers = 0;
    int gpu_workers = 0;
  };
  std::map<std::string, Held> jobs_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_OWNER_USAGE_H_
