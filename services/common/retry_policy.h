// Which failures another attempt may get past: the one home of that policy.
// A peer, the network or a worker went away (UNAVAILABLE), an attempt was
// superseded or a stream broke (ABORTED), a deadline passed
// (DEADLINE_EXCEEDED). Everything else (a bad spec, a NaN loss, out of memory,
// a corrupt checkpoint) is deterministic: retrying would fail the same way
// (docs/fault_tolerance.md). Workers mark their StageErrors with it; the
// coordinator recovers a job on such errors and fails it on the others.
#ifndef STAGEWISE_SERVICES_COMMON_RETRY_POLICY_H_
#define STAGEWISE_SERVICES_COMMON_RETRY_POLICY_H_

#include "absl/random/distributions.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace stagewise {

inline bool IsTransient(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kAborted ||
         code == absl::StatusCode::kDeadlineExceeded;
}

inline bool IsTransient(const absl::Status& status) { return IsTransient(status.code()); }

// A reconnect delay with jitter: uniform between half of `delay` and all of
// it, so that clients and workers that lost the same coordinator do not all
// redial in lockstep when it comes back.
// `gen`: an absl::BitGen (or any URBG).
template <typename Gen>
absl::Duration Jittered(absl::Duration delay, Gen& gen) {
  return delay * absl::Uniform(absl::IntervalClosed, gen, 0.5, 1.0);
}

// A stage that failed because a neighbour's stream ended (the neighbour
// cancelled it, or its process or link went away) reports an error that is
// most likely the echo of that neighbour's own: the coordinator lets the
// neighbour's report, when it comes, name the attempt's end instead
// (StageError.neighbour_stream). UNAVAILABLE, marked with a payload.
inline constexpr char kNeighbourStreamPayload[] = "type.stagewise.dev/neighbour-stream";
inline absl::Status NeighbourStreamError(absl::string_view message) {
  absl::Status status = absl::UnavailableError(message);
  status.SetPayload(kNeighbourStreamPayload, absl::Cord("1"));
  return status;
}
inline bool IsNeighbourStreamError(const absl::Status& status) {
  return status.GetPayload(kNeighbourStreamPayload).has_value();
}

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_RETRY_POLICY_H_
