#include "services/common/thread_slice.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace stagewise {
namespace {

// The kernel's struct sched_attr (glibc 2.36 has no wrapper for it).
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;  // SCHED_OTHER / SCHED_BATCH: the slice (ns), 6.12+
  uint64_t sched_deadline;
  uint64_t sched_period;
  uint32_t sched_util_min;
  uint32_t sched_util_max;
};

bool GetAttr(SchedAttr* attr) {
  std::memset(attr, 0, sizeof(*attr));
  return syscall(SYS_sched_getattr, 0, attr, sizeof(*attr), 0) == 0;
}

}  // namespace

bool RequestThreadSlice(int64_t micros) {
  if (micros < 100 || micros > 100000) return false;
  SchedAttr attr;
  if (!GetAttr(&attr)) return false;
  if (attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH) return false;
  // Policy and nice as they are; utilisation clamps are not touched (no
  // SCHED_FLAG_UTIL_CLAMP_* in the flags).
  attr.size = sizeof(attr);
  attr.sched_flags = 0;
  attr.sched_runtime = static_cast<uint64_t>(micros) * 1000;
  return syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
}

int64_t ThreadSliceMicros() {
  SchedAttr attr;
  if (!GetAttr(&attr)) return 0;
  return static_cast<int64_t>(attr.sched_runtime / 1000);
}

}  // namespace stagewise
