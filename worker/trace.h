// The pipeline timeline on a worker (docs/trace.md): the spans a stage's
// compute thread records, and the estimate of this host's clock offset to
// the coordinator's that puts every stage on one time axis.
#ifndef STAGEWISE_WORKER_TRACE_H_
#define STAGEWISE_WORKER_TRACE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::worker {

// Offset of this host's clock to the coordinator's, from the control
// stream's round trips (NTP's idea with one server): a probe leaves at t0
// (ours), the coordinator stamps it at c (its clock), the answer arrives at
// t1 (ours); then offset = c - (t0 + t1) / 2, wrong by at most (t1 - t0) / 2.
// The estimate is the sample with the shortest round trip among the last
// kWindow: queueing only ever adds delay. Thread-safe.
class ClockSync {
 public:
  static constexpr size_t kWindow = 32;
  struct Estimate {
    int64_t offset_us = 0;  // add to our clock to get the coordinator's
    int64_t rtt_us = -1;    // -1: no sample yet (offset 0)
  };
  void AddSample(int64_t sent_us, int64_t coordinator_us, int64_t received_us);
  Estimate Get() const;
  // Samples added so far (not only those in the window).
  int64_t samples() const;
  // This host's clock: unix microseconds (plus $STAGEWISE_TEST_CLOCK_SKEW_US,
  // a test hook that sets a worker's clock off).
  static int64_t NowUs();

 private:
  mutable absl::Mutex mu_;
  std::deque<Estimate> samples_ ABSL_GUARDED_BY(mu_);
  int64_t added_ ABSL_GUARDED_BY(mu_) = 0;
};

// The spans of one stage's compute thread while the stage is inside the
// job's trace window, bounded: past max_spans, spans are counted as dropped.
// The window counts the stage's own optimizer steps (Advance): from when it
// has done `from` steps of the phase until it has done `to`. Each span is
// labelled with the mini-batch it worked on, which under the decoupled
// algorithms differs from stage to stage at any moment.
// Nested recording is suppressed while a Scope is open (an evaluation pass
// is one span, not the sends and receives inside it), so the spans of a
// track never overlap. Thread-safe.
class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  // Steps [from, to) of each phase are recorded; `chunk` spans make a
  // TraceChunk ready (TakeChunk).
  Tracer(int64_t from, int64_t to, int64_t max_spans, size_t chunk = 2048);

  // The stage has done `steps_done` steps of the phase (0 at its start).
  void Advance(int64_t steps_done);
  // Whether the stage is inside the window now.
  bool Recording() const;
  void Record(v1::SpanKind kind, int64_t step, int micro_batch, Clock::time_point start,
              Clock::time_point end);

  // Records one span from construction to destruction and suppresses every
  // span recorded inside it (on any thread: the tracer has one writer, the
  // compute thread).
  class Scope {
   public:
    Scope(Tracer* tracer, v1::SpanKind kind, int64_t step, int micro_batch = 0);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer* tracer_;
    v1::SpanKind kind_;
    int64_t step_;
    int micro_batch_;
    Clock::time_point start_;
  };

  // Whether `chunk` spans are waiting, or any once the window is over.
  bool ChunkReady() const;
  // The spans recorded since the last call (start_us on this host's unix
  // clock), with the dropped count so far; fields other than spans and
  // dropped are the caller's.
  v1::TraceChunk TakeChunk();
  int64_t recorded() const;

 private:
  const int64_t from_, to_, max_spans_;
  const size_t chunk_;
  // steady_clock -> unix microseconds, fixed once per process.
  const Clock::time_point steady_base_;
  const int64_t unix_base_us_;
  mutable absl::Mutex mu_;
  int depth_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t position_ ABSL_GUARDED_BY(mu_) = 0;  // steps done
  int64_t kept_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::Span> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_TRACE_H_
