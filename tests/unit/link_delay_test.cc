// LinkDelay (worker/link_delay.h), the emulated link latency: no message is
// handed on before its delay is over; order is kept; holding is pipelined
// (messages held together wait together, not one after another); a full line
// pauses the stream and resumes it once, after a message left; a receiver
// that is gone or a Close drops what is held.
#include "worker/link_delay.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace stagewise::worker {
namespace {

v1::StageMessage Numbered(int64_t seq) {
  v1::StageMessage m;
  m.set_kind(v1::StageMessage::FORWARD);
  m.set_seq(seq);
  return m;
}

// What the line handed on: each message's number, when, and how many were
// still held then.
struct Received {
  absl::Mutex mu;
  std::vector<int64_t> seqs ABSL_GUARDED_BY(mu);
  std::vector<absl::Time> times ABSL_GUARDED_BY(mu);
  std::vector<size_t> held_then ABSL_GUARDED_BY(mu);

  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return seqs.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
};

TEST(LinkDelay, AMessageArrivesNoSoonerThanItsDelayAndInOrder) {
  Received got;
  const absl::Duration delay = absl::Milliseconds(60);
  std::vector<absl::Time> held_at;
  LinkDelay line(delay, 16, 1 << 20, [&](v1::StageMessage m) {
    absl::MutexLock lock(&got.mu);
    got.seqs.push_back(m.seq());
    got.times.push_back(absl::Now());
    return true;
  });
  for (int64_t seq = 1; seq <= 6; ++seq) {
    held_at.push_back(absl::Now());
    ASSERT_TRUE(*line.Hold(Numbered(seq), [] {}));
    if (seq == 3) absl::SleepFor(absl::Milliseconds(20));  // a gap in the sends
  }
  ASSERT_TRUE(got.WaitFor(6));
  absl::MutexLock lock(&got.mu);
  EXPECT_EQ(got.seqs, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  for (size_t i = 0; i < held_at.size(); ++i) {
    EXPECT_GE(got.times[i] - held_at[i], delay) << "message " << i + 1;
  }
}

TEST(LinkDelay, MessagesHeldTogetherWaitTogether) {
  // Pipelined: the second to fifth message do not queue behind the first's
  // delay. When the first leaves, the four others were held beside it.
  Received got;
  LinkDelay* line_ptr = nullptr;
  LinkDelay line(absl::Milliseconds(400), 16, 1 << 20, [&](v1::StageMessage m) {
    absl::MutexLock lock(&got.mu);
    got.seqs.push_back(m.seq());
    got.held_then.push_back(line_ptr->held());
    return true;
  });
  line_ptr = &line;
  for (int64_t seq = 1; seq <= 5; ++seq) ASSERT_TRUE(*line.Hold(Numbered(seq), [] {}));
  ASSERT_TRUE(got.WaitFor(5));
  absl::MutexLock lock(&got.mu);
  EXPECT_EQ(got.held_then, (std::vector<size_t>{4, 3, 2, 1, 0}));
}

TEST(LinkDelay, AFullLinePausesTheStreamAndResumesItOnce) {
  absl::Notification open_inbox;
  Received got;
  LinkDelay line(absl::Milliseconds(1), 2, 1 << 20, [&](v1::StageMessage m) {
    open_inbox.WaitForNotification();  // a full inbox
    absl::MutexLock lock(&got.mu);
    got.seqs.push_back(m.seq());
    return true;
  });
  int resumed = 0;
  absl::Mutex mu;
  auto resume = [&] {
    absl::MutexLock lock(&mu);
    ++resumed;
  };
  EXPECT_TRUE(*line.Hold(Numbered(1), resume));  // taken by the thread, blocked
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(*line.Hold(Numbered(2), resume));
  EXPECT_FALSE(*line.Hold(Numbered(3), resume));  // two held: full, the stream pauses
  absl::SleepFor(absl::Milliseconds(50));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(resumed, 0) << "resumed while the inbox was still full";
  }
  open_inbox.Notify();
  ASSERT_TRUE(got.WaitFor(3));
  {
    absl::MutexLock lock(&got.mu);
    EXPECT_EQ(got.seqs, (std::vector<int64_t>{1, 2, 3}));
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(resumed, 1);
}

TEST(LinkDelay, TheByteWindowPausesTheStreamToo) {
  absl::Notification open_inbox;
  LinkDelay line(absl::Milliseconds(1), 100, 3000, [&](v1::StageMessage) {
    open_inbox.WaitForNotification();
    return true;
  });
  v1::StageMessage big = Numbered(1);
  big.set_job_id(std::string(1000, 'x'));  // about 1 KB each
  int resumed = 0;
  absl::Mutex mu;
  auto resume = [&] {
    absl::MutexLock lock(&mu);
    ++resumed;
  };
  EXPECT_TRUE(*line.Hold(big, resume));  // taken by the thread, blocked
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(*line.Hold(big, resume));
  EXPECT_TRUE(*line.Hold(big, resume));
  EXPECT_FALSE(*line.Hold(big, resume));  // 3 KB held: the window is full
  open_inbox.Notify();
  for (int i = 0; i < 3000 && line.held() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(line.held(), 0u);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(resumed, 1);
}

TEST(LinkDelay, CloseDropsWhatIsHeldAndRefusesMore) {
  Received got;
  LinkDelay line(absl::Seconds(30), 8, 1 << 20, [&](v1::StageMessage m) {
    absl::MutexLock lock(&got.mu);
    got.seqs.push_back(m.seq());
    return true;
  });
  ASSERT_TRUE(*line.Hold(Numbered(1), [] {}));
  EXPECT_EQ(line.held(), 1u);
  line.Close();  // does not wait out the 30 s
  EXPECT_EQ(line.held(), 0u);
  EXPECT_EQ(line.Hold(Numbered(2), [] {}).status().code(), absl::StatusCode::kCancelled);
  absl::MutexLock lock(&got.mu);
  EXPECT_TRUE(got.seqs.empty());
}

TEST(LinkDelay, AReceiverThatIsGoneClosesTheLine) {
  LinkDelay line(absl::Milliseconds(1), 8, 1 << 20, [](v1::StageMessage) { return false; });
  ASSERT_TRUE(*line.Hold(Numbered(1), [] {}));
  absl::StatusOr<bool> held = true;
  for (int i = 0; i < 3000 && held.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    held = line.Hold(Numbered(2 + i), [] {});
  }
  EXPECT_EQ(held.status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace stagewise::worker
