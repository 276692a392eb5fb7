// SendPipe (worker/send_pipe.h): sends encoded off the caller's thread, in
// order; the queue bounded; the first failure sticky and reported once; Close
// wakes a blocked Push; Drain waits for the last send.
#include "worker/send_pipe.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace stagewise::worker {
namespace {

v1::StageMessage Numbered(int64_t step) {
  v1::StageMessage m;
  m.set_kind(v1::StageMessage::FORWARD);
  m.set_step(step);
  return m;
}

// Records what it is handed, where, and can hold every delivery until released.
class Receiver {
 public:
  absl::Status Deliver(v1::StageMessage m, int64_t step) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&open_));
    if (step == fail_at_) return absl::UnavailableError("the stream broke");
    steps_.push_back(step);
    EXPECT_EQ(m.step(), step);
    threads_.push_back(std::this_thread::get_id());
    messages_.push_back(std::move(m));
    return absl::OkStatus();
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void FailAt(int64_t step) {
    absl::MutexLock lock(&mu_);
    fail_at_ = step;
  }
  std::vector<int64_t> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  std::vector<std::thread::id> threads() {
    absl::MutexLock lock(&mu_);
    return threads_;
  }
  std::vector<v1::StageMessage> messages() {
    absl::MutexLock lock(&mu_);
    return messages_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int64_t fail_at_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StageMessage> messages_ ABSL_GUARDED_BY(mu_);
};

SendPipe::Deliver To(Receiver& r) {
  return [&r](v1::StageMessage m, int64_t step) { return r.Deliver(std::move(m), step); };
}

TEST(SendPipe, EncodesOffTheCallersThreadAndDeliversInOrder) {
  Receiver r;
  SendPipe pipe(2, To(r), nullptr);
  const torch::Tensor x = torch::arange(6, torch::kFloat).view({2, 3});
  for (int64_t step = 0; step < 20; ++step) {
    EncodeOptions wire;
    ASSERT_TRUE(pipe.Push(Numbered(step), {{"x", x + step, wire}}, step).ok());
  }
  ASSERT_TRUE(pipe.Drain().ok());
  EXPECT_EQ(pipe.pending(), 0);
  std::vector<int64_t> want(20);
  for (int64_t i = 0; i < 20; ++i) want[i] = i;
  EXPECT_EQ(r.steps(), want);
  for (std::thread::id id : r.threads()) EXPECT_NE(id, std::this_thread::get_id());
  // Encoded as EncodeTensor would: each decodes to what was queued.
  const std::vector<v1::StageMessage> got = r.messages();
  for (int64_t step = 0; step < 20; ++step) {
    auto decoded = DecodeTensor(got[step].tensors().at("x"));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_TRUE(torch::equal(*decoded, x + step)) << step;
  }
}

TEST(SendPipe, PushBlocksWhileTheQueueIsFull) {
  Receiver r;
  r.Hold();
  SendPipe pipe(2, To(r), nullptr);
  // One held in delivery, two queued: the fourth push waits.
  for (int64_t step = 0; step < 3; ++step) ASSERT_TRUE(pipe.Push(Numbered(step), {}, step).ok());
  std::atomic<bool> pushed{false};
  std::thread fourth([&] {
    EXPECT_TRUE(pipe.Push(Numbered(3), {}, 3).ok());
    pushed = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(pushed.load());
  EXPECT_GE(pipe.pending(), 3);
  r.Release();
  fourth.join();
  EXPECT_TRUE(pushed.load());
  ASSERT_TRUE(pipe.Drain().ok());
  EXPECT_EQ(r.steps(), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(SendPipe, TheFirstFailureIsReportedOnceAndFailsLaterSends) {
  Receiver r;
  r.FailAt(2);
  std::atomic<int> reported{0};
  absl::Notification failed;
  SendPipe pipe(4, To(r), [&](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    if (reported.fetch_add(1) == 0) failed.Notify();
  });
  for (int64_t step = 0; step < 4; ++step) (void)pipe.Push(Numbered(step), {}, step);
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(pipe.Drain().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pipe.Push(Numbered(9), {}, 9).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reported.load(), 1);
  // What followed the failed send was dropped, not sent out of order.
  EXPECT_EQ(r.steps(), (std::vector<int64_t>{0, 1}));
}

TEST(SendPipe, AnEncodingErrorNamesTheTensor) {
  Receiver r;
  absl::Notification failed;
  SendPipe pipe(2, To(r), [&](const absl::Status&) { failed.Notify(); });
  EncodeOptions bad;
  bad.compression = static_cast<v1::Compression>(999);
  ASSERT_TRUE(pipe.Push(Numbered(0), {{"grad", torch::ones({3}), bad}}, 0).ok());
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::Status s = pipe.Drain();
  EXPECT_NE(s.message().find("tensors['grad']"), std::string::npos) << s;
  EXPECT_TRUE(r.steps().empty());
}

TEST(SendPipe, CloseWakesABlockedPushAndDropsWhatWaits) {
  Receiver r;
  r.Hold();
  SendPipe pipe(1, To(r), nullptr);
  ASSERT_TRUE(pipe.Push(Numbered(0), {}, 0).ok());
  ASSERT_TRUE(pipe.Push(Numbered(1), {}, 1).ok());
  std::thread blocked(
      [&] { EXPECT_EQ(pipe.Push(Numbered(2), {}, 2).code(), absl::StatusCode::kCancelled); });
  absl::SleepFor(absl::Milliseconds(50));
  pipe.Close(absl::CancelledError("stopped"));
  blocked.join();
  EXPECT_EQ(pipe.Drain().code(), absl::StatusCode::kCancelled);
  r.Release();  // the send in delivery finishes; nothing after it goes
  EXPECT_LE(r.steps().size(), 1u);
}

}  // namespace
}  // namespace stagewise::worker
