// The worker's pipeline-timeline pieces: the clock offset estimate from
// round trips, and the bounded span recorder (window, nesting, limit,
// chunks).
#include "worker/trace.h"

#include <gtest/gtest.h>

#include <chrono>

namespace stagewise::worker {
namespace {

using std::chrono::microseconds;

TEST(ClockSyncTest, NoSampleMeansOffsetZeroAndUnknownError) {
  ClockSync clock;
  EXPECT_EQ(clock.Get().offset_us, 0);
  EXPECT_EQ(clock.Get().rtt_us, -1);
}

TEST(ClockSyncTest, TheShortestRoundTripWins) {
  ClockSync clock;
  // The coordinator runs 5 s ahead. A probe sent at t0 is stamped halfway
  // through a symmetric trip; queueing delays the answer of the others.
  const int64_t ahead = 5'000'000;
  clock.AddSample(1'000, 1'000 + 400 + ahead, 1'000 + 2'000);     // slow answer: off by 600
  clock.AddSample(10'000, 10'000 + 50 + ahead, 10'000 + 100);     // 100 us, symmetric
  clock.AddSample(20'000, 20'000 + 900 + ahead, 20'000 + 1'000);  // delayed on the way out
  const ClockSync::Estimate e = clock.Get();
  EXPECT_EQ(e.rtt_us, 100);
  EXPECT_EQ(e.offset_us, ahead);
}

TEST(ClockSyncTest, OldSamplesLeaveTheWindowAndBackwardStepsAreIgnored) {
  ClockSync clock;
  clock.AddSample(0, 7, 10);  // the best, but it will age out
  for (size_t i = 1; i <= ClockSync::kWindow; ++i) {
    const auto t = static_cast<int64_t>(i) * 1000;
    clock.AddSample(t, t + 1'000'000 + 50, t + 100);
  }
  EXPECT_EQ(clock.Get().rtt_us, 100);
  EXPECT_EQ(clock.Get().offset_us, 1'000'000);
  clock.AddSample(5'000, 0, 4'000);  // the answer "before" the probe: no information
  EXPECT_EQ(clock.Get().rtt_us, 100);
}

TEST(TracerTest, RecordsWhileTheStagesStepCountIsInTheWindow) {
  Tracer tracer(2, 4, 100);
  const auto t0 = Tracer::Clock::now();
  for (int64_t done = 0; done < 6; ++done) {
    tracer.Advance(done);
    EXPECT_EQ(tracer.Recording(), done == 2 || done == 3) << done;
    // The span's label is the mini-batch it worked on, whatever the window.
    tracer.Record(v1::SPAN_FORWARD, done + 7, 0, t0 + microseconds(done * 10),
                  t0 + microseconds(done * 10 + 5));
  }
  const v1::TraceChunk chunk = tracer.TakeChunk();
  ASSERT_EQ(chunk.spans_size(), 2);
  EXPECT_EQ(chunk.spans(0).step(), 9);
  EXPECT_EQ(chunk.spans(1).step(), 10);
  EXPECT_EQ(chunk.spans(0).duration_us(), 5);
  EXPECT_EQ(chunk.spans(1).start_us() - chunk.spans(0).start_us(), 10);
  EXPECT_EQ(tracer.TakeChunk().spans_size(), 0);  // taken
}

TEST(TracerTest, AScopeIsOneSpanAndHidesWhatHappensInside) {
  Tracer tracer(0, 10, 100);
  {
    Tracer::Scope eval(&tracer, v1::SPAN_EVAL, 3);
    const auto t = Tracer::Clock::now();
    tracer.Record(v1::SPAN_WAIT_PREV, 3, 1, t, t);
    tracer.Record(v1::SPAN_SEND, 3, 1, t, t);
  }
  tracer.Record(v1::SPAN_STEP, 3, 0, Tracer::Clock::now(), Tracer::Clock::now());
  const v1::TraceChunk chunk = tracer.TakeChunk();
  ASSERT_EQ(chunk.spans_size(), 2);
  EXPECT_EQ(chunk.spans(0).kind(), v1::SPAN_EVAL);
  EXPECT_EQ(chunk.spans(0).step(), 3);
  EXPECT_EQ(chunk.spans(1).kind(), v1::SPAN_STEP);
  // A scope opened outside the window records nothing and hides nothing.
  tracer.Advance(12);
  {
    Tracer::Scope eval(&tracer, v1::SPAN_EVAL, 12);
    tracer.Advance(4);
    tracer.Record(v1::SPAN_FORWARD, 4, 0, Tracer::Clock::now(), Tracer::Clock::now());
  }
  const v1::TraceChunk after = tracer.TakeChunk();
  ASSERT_EQ(after.spans_size(), 1);
  EXPECT_EQ(after.spans(0).kind(), v1::SPAN_FORWARD);
  // Without a tracer, a scope is a no-op.
  Tracer::Scope nothing(nullptr, v1::SPAN_EVAL, 0);
}

TEST(TracerTest, PastTheLimitSpansAreCountedNotKept) {
  Tracer tracer(0, 100, 3, /*chunk=*/2);
  const auto t = Tracer::Clock::now();
  tracer.Record(v1::SPAN_FORWARD, 0, 0, t, t);
  EXPECT_FALSE(tracer.ChunkReady());
  tracer.Record(v1::SPAN_BACKWARD, 0, 0, t, t);
  EXPECT_TRUE(tracer.ChunkReady());
  EXPECT_EQ(tracer.TakeChunk().spans_size(), 2);
  for (int i = 0; i < 5; ++i) tracer.Record(v1::SPAN_FORWARD, 1, 0, t, t);
  const v1::TraceChunk chunk = tracer.TakeChunk();
  EXPECT_EQ(chunk.spans_size(), 1);
  EXPECT_EQ(chunk.dropped(), 4);
  EXPECT_EQ(tracer.recorded(), 3);
}

// A running job's trace reaches the coordinator when its window is over,
// not only when a chunk is full (the doctor reads it while the job runs).
TEST(TracerTest, TheSpansGoOnceTheWindowIsOver) {
  Tracer tracer(2, 4, 100, /*chunk=*/50);
  const auto t = Tracer::Clock::now();
  tracer.Advance(2);
  tracer.Record(v1::SPAN_FORWARD, 2, 0, t, t);
  tracer.Advance(3);
  EXPECT_FALSE(tracer.ChunkReady());
  tracer.Advance(4);
  EXPECT_TRUE(tracer.ChunkReady());
  EXPECT_EQ(tracer.TakeChunk().spans_size(), 1);
  EXPECT_FALSE(tracer.ChunkReady());
}

TEST(TracerTest, ANegativeDurationIsZero) {
  Tracer tracer(0, 1, 10);
  const auto t = Tracer::Clock::now();
  tracer.Record(v1::SPAN_FORWARD, 0, 0, t, t - microseconds(3));
  EXPECT_EQ(tracer.TakeChunk().spans(0).duration_us(), 0);
}

}  // namespace
}  // namespace stagewise::worker
