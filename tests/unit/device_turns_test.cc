// DeviceTurns (worker/device_turns.h): the chunks a worker holds run the
// worker's order one position at a time, step after step, and a cancelled
// order wakes every waiter.
#include "worker/device_turns.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace stagewise::worker {
namespace {

TEST(DeviceTurns, ChunksRunTheWorkersOrderStepAfterStep) {
  // A worker's order of 7 operations over 3 chunks, as chunk indices.
  const std::vector<int> order = {0, 0, 1, 2, 0, 1, 2};
  const int steps = 4;
  DeviceTurns turns;
  absl::Mutex mu;
  std::vector<int> ran;  // chunk of every operation, in the order they ran
  std::vector<std::thread> chunks;
  for (int c = 2; c >= 0; --c) {  // started last-first: the order, not the start, decides
    chunks.emplace_back([&, c] {
      for (int64_t step = 0; step < steps; ++step) {
        for (int pos = 0; pos < static_cast<int>(order.size()); ++pos) {
          if (order[pos] != c) continue;
          ASSERT_TRUE(turns.Acquire(step, pos, static_cast<int>(order.size())).ok());
          {
            absl::MutexLock lock(&mu);
            ran.push_back(c);
          }
          absl::SleepFor(absl::Microseconds(200));  // room for another chunk to barge in
          ASSERT_TRUE(turns.Release(step, pos, static_cast<int>(order.size())).ok());
        }
      }
    });
  }
  for (auto& t : chunks) t.join();
  std::vector<int> want;
  for (int s = 0; s < steps; ++s) want.insert(want.end(), order.begin(), order.end());
  EXPECT_EQ(ran, want);
  EXPECT_EQ(turns.position(), 0);
  EXPECT_EQ(turns.step(), steps - 1);
}

TEST(DeviceTurns, ANextStepWaitsForTheWholeOrderOfTheLastOne) {
  DeviceTurns turns;
  ASSERT_TRUE(turns.Acquire(0, 0, 2).ok());
  ASSERT_TRUE(turns.Release(0, 0, 2).ok());
  // Position 0 of step 1 is not due while position 1 of step 0 is.
  bool started = false;
  absl::Mutex mu;
  std::thread next([&] {
    ASSERT_TRUE(turns.Acquire(1, 0, 2).ok());
    absl::MutexLock lock(&mu);
    started = true;
  });
  absl::SleepFor(absl::Milliseconds(20));
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(started);
  }
  ASSERT_TRUE(turns.Acquire(0, 1, 2).ok());
  ASSERT_TRUE(turns.Release(0, 1, 2).ok());
  next.join();
  EXPECT_TRUE(started);
  EXPECT_EQ(turns.step(), 1);
}

TEST(DeviceTurns, CancelWakesEveryWaiterWithTheReason) {
  DeviceTurns turns;
  std::vector<absl::Status> got(3);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] { got[i] = turns.Acquire(0, i + 1, 4); });
  }
  absl::SleepFor(absl::Milliseconds(10));
  turns.Cancel(absl::AbortedError("stage 3 failed"));
  for (auto& t : waiters) t.join();
  for (const absl::Status& s : got) {
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_EQ(s.message(), "stage 3 failed");
  }
  // For good: later callers get it at once, and the first reason stays.
  turns.Cancel(absl::CancelledError("stopped"));
  EXPECT_TRUE(absl::IsAborted(turns.Acquire(0, 0, 4)));
  EXPECT_TRUE(absl::IsAborted(turns.Release(0, 0, 4)));
}

TEST(DeviceTurns, PositionsOutsideTheOrderAndReleasesOutOfTurnAreRefused) {
  DeviceTurns turns;
  EXPECT_TRUE(absl::IsInvalidArgument(turns.Acquire(0, 3, 3)));
  EXPECT_TRUE(absl::IsInvalidArgument(turns.Acquire(0, -1, 3)));
  ASSERT_TRUE(turns.Acquire(0, 0, 3).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(turns.Release(0, 1, 3)));
  EXPECT_TRUE(absl::IsFailedPrecondition(turns.Release(1, 0, 3)));
  EXPECT_TRUE(turns.Release(0, 0, 3).ok());
  EXPECT_EQ(turns.position(), 1);
}

}  // namespace
}  // namespace stagewise::worker
