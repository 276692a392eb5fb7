#include "services/tensor/ring_leases.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace stagewise {
namespace {

struct Entry {
  const void* owner;
  int64_t seq;
  RingLease lease;
};

struct Registry {
  absl::Mutex mu;
  uint64_t next_id ABSL_GUARDED_BY(mu) = 0;  // also the count lent so far
  std::map<uint64_t, Entry> leases ABSL_GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: used until exit
  return *registry;
}

}  // namespace

uint64_t RingLeases::Lend(const void* owner, int64_t seq, RingLease lease) {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  const uint64_t id = ++r.next_id;
  r.leases.emplace(id, Entry{owner, seq, std::move(lease)});
  return id;
}

std::optional<RingLease> RingLeases::Take(uint64_t id) {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.leases.find(id);
  if (it == r.leases.end()) return std::nullopt;
  std::optional<RingLease> lease(std::move(it->second.lease));
  r.leases.erase(it);
  return lease;
}

bool RingLeases::Read(uint64_t id, const std::function<void(const uint8_t* bytes)>& read) {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.leases.find(id);
  if (it == r.leases.end()) return false;
  read(it->second.lease.bytes());
  return true;
}

int RingLeases::Reap(const void* owner, int64_t below_seq) {
  std::vector<Entry> returned;  // released outside the lock
  Registry& r = TheRegistry();
  {
    absl::MutexLock lock(&r.mu);
    for (auto it = r.leases.begin(); it != r.leases.end();) {
      if (it->second.owner == owner && it->second.seq < below_seq) {
        returned.push_back(std::move(it->second));
        it = r.leases.erase(it);
      } else {
        ++it;
      }
    }
  }
  return static_cast<int>(returned.size());
}

int64_t RingLeases::TotalLent() {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  return static_cast<int64_t>(r.next_id);
}

int64_t RingLeases::Outstanding() {
  Registry& r = TheRegistry();
  absl::MutexLock lock(&r.mu);
  return static_cast<int64_t>(r.leases.size());
}

}  // namespace stagewise
