// Whether the coordinator takes a WorkerEvent from its sender, and what it
// does with one it does not. Pure functions of the event and the live job it
// names (the envelope's job_id): unit-tested with hand-built jobs
// (tests/unit/event_admission_test.cc).
//
// An event is taken when it is about a live job the sender runs the stage of
// (the envelope's stage), in the job's current attempt, with numbers in range.
// Events of an ended attempt are dropped, except the root cause of that end: a
// deterministic error from the stage that ran it, which fails the job (its
// peers' broken streams may have been reported first; the next attempt would
// fail the same way).
#ifndef STAGEWISE_COORDINATOR_EVENT_ADMISSION_H_
#define STAGEWISE_COORDINATOR_EVENT_ADMISSION_H_

#include <cmath>
#include <iterator>
#include <string>

#include "coordinator/live_job.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

struct Admission {
  enum class Verdict {
    kTake,       // hand it to its handler
    kRefuse,     // count it (label) and drop it; log `why` unless quiet()
    kDropStale,  // an ended attempt's event from the worker that ran it: drop silently
    kFailJob,    // the root cause of the ended attempt: fail the job with `why`
  };
  Verdict verdict = Verdict::kTake;
  // The refusal's metric label (stagewise_coordinator_refused_total{reason}):
  // unknown_job, stale_attempt, not_assigned, wrong_stage (a number only the
  // last stage reports, from another), out_of_range or repeated (a stage's
  // second PhaseDone for one phase).
  std::string label;
  std::string why;
  // Late traffic of ended jobs and attempts is normal: not worth a log line.
  bool quiet() const { return label == "unknown_job" || label == "stale_attempt"; }
};

// `job`: the live job event.job_id() names, or null when there is none.
// Acks and heartbeats are always taken (OnAck matches an ack to its command).
Admission AdmitEvent(const v1::WorkerEvent& event, const LiveJob* job);

// The attempt an event belongs to, or -1 for events of no attempt (acks,
// heartbeats, profiles, errors of no stage).
int EventAttempt(const v1::WorkerEvent& event);

// Errors another attempt may get past: a peer, the network or a worker went
// away (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED, or the worker says so).
// Everything else is deterministic (docs/fault_tolerance.md).
bool IsRetryable(const v1::StageError& error);

// A copy of a report without its NaN and infinite values (a diverged job's
// loss, say): they would corrupt the job's status and history. The worker
// itself fails a stage whose training loss stops being finite.
template <typename Report>
Report WithoutNonFinite(const Report& report) {
  Report out = report;
  auto* values = out.mutable_values();
  for (auto it = values->begin(); it != values->end();) {
    it = std::isfinite(it->second) ? std::next(it) : values->erase(it);
  }
  return out;
}

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_EVENT_ADMISSION_H_
