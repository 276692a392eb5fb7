// A short scheduler time slice for a latency-sensitive thread.
//
// Linux's fair scheduler (EEVDF, 6.6 and later) gives every runnable thread
// a slice of about 3 ms by default; from 6.12 a thread may ask for a shorter
// one (sched_setattr's sched_runtime for SCHED_OTHER), and a thread with a
// shorter slice has an earlier deadline, so when it wakes on busy cores it
// preempts a thread running on the default slice instead of queueing behind
// it. A stage's send pipe asks for one (worker/send_pipe.h): its thread runs
// for tens of microseconds per message, and when it waits for a core the
// whole pipeline waits with it (docs/performance.md, "A short slice for the
// send thread").
#ifndef STAGEWISE_SERVICES_COMMON_THREAD_SLICE_H_
#define STAGEWISE_SERVICES_COMMON_THREAD_SLICE_H_

#include <cstdint>

namespace stagewise {

inline constexpr int64_t kShortSliceMicros = 100;  // the kernel's minimum

// Asks for a slice of `micros` (100 to 100000) for the calling thread,
// keeping its policy and nice value. Best effort: false when the kernel
// refused or the thread is not under the fair scheduler's normal or batch
// policy; kernels before 6.12 take the call and ignore the slice.
bool RequestThreadSlice(int64_t micros = kShortSliceMicros);

// The calling thread's slice as the kernel reports it (microseconds; 0 when
// it does not say, as kernels before 6.12 do not).
int64_t ThreadSliceMicros();

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_THREAD_SLICE_H_
