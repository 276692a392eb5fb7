#include "worker/trace.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace stagewise::worker {

int64_t ClockSync::NowUs() {
  // A test hook: a worker whose clock is off by this much (tests/integration:
  // traces still land on the coordinator's clock).
  static const int64_t skew = [] {
    const char* text = std::getenv("STAGEWISE_TEST_CLOCK_SKEW_US");
    int64_t value = 0;
    return text != nullptr && absl::SimpleAtoi(text, &value) ? value : 0;
  }();
  return absl::ToUnixMicros(absl::Now()) + skew;
}

void ClockSync::AddSample(int64_t sent_us, int64_t coordinator_us, int64_t received_us) {
  if (received_us < sent_us) return;  // our clock stepped back in between: no information
  Estimate e;
  e.rtt_us = received_us - sent_us;
  // c - (t0 + t1) / 2 without overflowing the sum.
  e.offset_us = coordinator_us - (sent_us + e.rtt_us / 2);
  absl::MutexLock lock(&mu_);
  samples_.push_back(e);
  ++added_;
  if (samples_.size() > kWindow) samples_.pop_front();
}

int64_t ClockSync::samples() const {
  absl::MutexLock lock(&mu_);
  return added_;
}

ClockSync::Estimate ClockSync::Get() const {
  absl::MutexLock lock(&mu_);
  Estimate best;
  for (const Estimate& e : samples_) {
    if (best.rtt_us < 0 || e.rtt_us < best.rtt_us) best = e;
  }
  return best;
}

namespace {

// steady_clock -> this host's unix clock, fixed once per process: every
// tracer of the process maps alike, so spans of stages in one process
// compare exactly.
struct ClockBase {
  Tracer::Clock::time_point steady = Tracer::Clock::now();
  int64_t unix_us = ClockSync::NowUs();
};

const ClockBase& Base() {
  static const ClockBase base;
  return base;
}

}  // namespace

Tracer::Tracer(int64_t from, int64_t to, int64_t max_spans, size_t chunk)
    : from_(from),
      to_(to),
      max_spans_(max_spans),
      chunk_(std::max<size_t>(chunk, 1)),
      steady_base_(Base().steady),
      unix_base_us_(Base().unix_us) {}

void Tracer::Advance(int64_t steps_done) {
  absl::MutexLock lock(&mu_);
  position_ = steps_done;
}

bool Tracer::Recording() const {
  absl::MutexLock lock(&mu_);
  return position_ >= from_ && position_ < to_;
}

void Tracer::Record(v1::SpanKind kind, int64_t step, int micro_batch, Clock::time_point start,
                    Clock::time_point end) {
  absl::MutexLock lock(&mu_);
  if (position_ < from_ || position_ >= to_ || depth_ > 0) return;
  if (kept_ >= max_spans_) {
    ++dropped_;
    return;
  }
  ++kept_;
  v1::Span& s = pending_.emplace_back();
  s.set_kind(kind);
  s.set_start_us(
      unix_base_us_ +
      std::chrono::duration_cast<std::chrono::microseconds>(start - steady_base_).count());
  s.set_duration_us(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::microseconds>(end - start).count()));
  s.set_step(step);
  s.set_micro_batch(micro_batch);
}

Tracer::Scope::Scope(Tracer* tracer, v1::SpanKind kind, int64_t step, int micro_batch)
    : tracer_(tracer != nullptr && tracer->Recording() ? tracer : nullptr),
      kind_(kind),
      step_(step),
      micro_batch_(micro_batch),
      start_(Clock::now()) {
  if (tracer_ == nullptr) return;
  absl::MutexLock lock(&tracer_->mu_);
  ++tracer_->depth_;
}

Tracer::Scope::~Scope() {
  if (tracer_ == nullptr) return;
  {
    absl::MutexLock lock(&tracer_->mu_);
    --tracer_->depth_;
  }
  tracer_->Record(kind_, step_, micro_batch_, start_, Clock::now());
}

bool Tracer::ChunkReady() const {
  absl::MutexLock lock(&mu_);
  // Full, or the window is over: what it holds goes at once (the doctor
  // reads a running job's trace).
  return pending_.size() >= chunk_ || (position_ >= to_ && !pending_.empty());
}

v1::TraceChunk Tracer::TakeChunk() {
  absl::MutexLock lock(&mu_);
  v1::TraceChunk chunk;
  chunk.mutable_spans()->Reserve(static_cast<int>(pending_.size()));
  for (v1::Span& s : pending_) *chunk.add_spans() = std::move(s);
  pending_.clear();
  chunk.set_dropped(dropped_);
  return chunk;
}

int64_t Tracer::recorded() const {
  absl::MutexLock lock(&mu_);
  return kept_;
}

}  // namespace stagewise::worker
