// Which failures another attempt may get past: the one home of that policy.
// A peer, the network or a worker went away (UNAVAILABLE), an attempt was
// superseded or a stream broke (ABORTED), a deadline passed
// (DEADLINE_EXCEEDED). Everything else (a bad spec, a NaN loss, out of memory,
// a corrupt checkpoint) is deterministic: retrying would fail the same way
// (docs/fault_tolerance.md). Workers mark their StageErrors with it; the
// coordinator recovers a job on such errors and fails it on the others.
#ifndef STAGEWISE_SERVICES_COMMON_RETRY_POLICY_H_
#define STAGEWISE_SERVICES_COMMON_RETRY_POLICY_H_

#include "absl/status/status.h"

namespace stagewise {

inline bool IsTransient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kAborted ||
         code == absl::StatusCode::kDeadlineExceeded;
}

inline bool IsTransient(const absl::Status& status) { return IsTransient(status.code()); }

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_RETRY_POLICY_H_
