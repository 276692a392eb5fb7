// The key-value maps the replicas of a job's stages meet through before they
// connect their gloo groups (Coordinator.CollectiveStore, docs/replicas.md):
// one map per job attempt, in memory only (a coordinator restart starts a new
// attempt anyway), bounded, dropped when the attempt or the job ends.
//
// Threading: thread-safe (the service calls it from gRPC threads, the job
// manager's loop thread drops maps).
#ifndef STAGEWISE_COORDINATOR_COLLECTIVE_STORE_H_
#define STAGEWISE_COORDINATOR_COLLECTIVE_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class CollectiveStores {
 public:
  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = 64 << 10;
  static constexpr size_t kMaxKeysPerAttempt = 4096;

  // Applies `request` (its op, key, value) to the map of (job_id, attempt);
  // a newer attempt of the job drops the older one's map. The caller has
  // checked that the sender belongs to that attempt. INVALID_ARGUMENT for an
  // oversized key or value or an unknown op; RESOURCE_EXHAUSTED past
  // kMaxKeysPerAttempt.
  absl::Status Apply(const v1::CollectiveStoreRequest& request,
                     v1::CollectiveStoreResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops every map of the job (it ended or starts another attempt).
  void Drop(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  size_t jobs() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Attempt {
    int attempt = 0;
    std::map<std::string, std::string> values;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Attempt> by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_COLLECTIVE_STORE_H_
