// NeighbourLink (worker/neighbour_link.h) without gRPC: a fake stream records
// what is sent. Numbering; with recovery.replay, keeping what was sent,
// resending after a new stream exactly what the peer does not hold, in
// order, dropping duplicates, trimming at a committed checkpoint, and
// failing when the peer asks for a dropped message.
#include "worker/neighbour_link.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace stagewise::worker {
namespace {

class FakeStream : public PeerStream {
 public:
  FakeStream() : PeerStream("fake", 4) {}
  absl::Status Send(v1::StageMessage message) override {
    absl::MutexLock lock(&mu_);
    if (broken_) return absl::UnavailableError("broken");
    seqs_.push_back(message.seq());
    return absl::OkStatus();
  }
  void Close(const absl::Status&) override {
    absl::MutexLock lock(&mu_);
    broken_ = true;
  }
  void WaitDone() const override {}
  // Waits until `n` messages were sent; their numbers.
  std::vector<int64_t> Sent(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return seqs_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return seqs_;
  }
  void Break() {
    absl::MutexLock lock(&mu_);
    broken_ = true;
  }

 protected:
  void DoStartRead(v1::StageMessage*) override {}
  void DoStartWrite(const v1::StageMessage*) override {}
  void DoFinish(const absl::Status&) override {}

 private:
  absl::Mutex mu_;
  std::vector<int64_t> seqs_ ABSL_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

v1::StageMessage Forward(int64_t step) {
  v1::StageMessage m;
  m.set_kind(v1::StageMessage::FORWARD);
  m.set_step(step);
  return m;
}

TEST(NeighbourLinkTest, WithoutReplayItNumbersAndSendsAtOnce) {
  NeighbourLink link({.name = "stage 1", .replay = false});
  EXPECT_EQ(link.Send(Forward(0), 0).code(), absl::StatusCode::kFailedPrecondition);
  auto stream = std::make_shared<FakeStream>();
  link.Attach(stream, 0);
  ASSERT_TRUE(link.Send(Forward(0), 0).ok());
  ASSERT_TRUE(link.Send(Forward(0), 0).ok());
  EXPECT_EQ(stream->Sent(2), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(link.Detach(stream.get()));  // the stage fails instead
  EXPECT_EQ(link.kept_messages(), 0);
  EXPECT_TRUE(*link.Arrived(7));  // no gaps checked without replay
  EXPECT_EQ(link.held(), 7);
  link.Close(absl::CancelledError("done"));
}

TEST(NeighbourLinkTest, AfterABreakItResendsWhatTheNewPeerDoesNotHold) {
  NeighbourLink link({.name = "stage 1", .replay = true});
  auto first = std::make_shared<FakeStream>();
  link.Attach(first, 0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(link.Send(Forward(i), i).ok());
  EXPECT_EQ(first->Sent(3), (std::vector<int64_t>{1, 2, 3}));
  // The peer is lost: sends are kept, none goes out.
  first->Break();
  EXPECT_TRUE(link.Detach(first.get()));
  EXPECT_FALSE(link.attached());
  for (int i = 3; i < 6; ++i) ASSERT_TRUE(link.Send(Forward(i), i).ok());
  EXPECT_EQ(link.kept_messages(), 6);
  // Its replacement holds messages up to 2 (its checkpoint): 3..6 again.
  auto second = std::make_shared<FakeStream>();
  link.Attach(second, 2);
  EXPECT_EQ(second->Sent(4), (std::vector<int64_t>{3, 4, 5, 6}));
  ASSERT_TRUE(link.Send(Forward(6), 6).ok());
  EXPECT_EQ(second->Sent(5), (std::vector<int64_t>{3, 4, 5, 6, 7}));
  link.Flush();
  // An old stream closing late changes nothing.
  EXPECT_TRUE(link.Detach(first.get()));
  EXPECT_TRUE(link.attached());
  link.Close(absl::CancelledError("done"));
  link.WaitDone();
}

TEST(NeighbourLinkTest, ResentDuplicatesAreDroppedAndGapsRefused) {
  NeighbourLink link({.name = "stage 0", .replay = true});
  link.Resume(/*sent=*/10, /*taken=*/4);  // a shard's counts
  EXPECT_EQ(link.held(), 4);
  EXPECT_TRUE(*link.Arrived(5));
  EXPECT_TRUE(*link.Arrived(6));
  EXPECT_FALSE(*link.Arrived(6));  // resent after a reconnection
  EXPECT_FALSE(*link.Arrived(3));
  EXPECT_EQ(link.Arrived(8).status().code(), absl::StatusCode::kDataLoss);
  link.Took(6);
  EXPECT_EQ(link.taken(), 6);
  // Numbering goes on from the shard's.
  auto stream = std::make_shared<FakeStream>();
  link.Attach(stream, 10);
  ASSERT_TRUE(link.Send(Forward(3), 3).ok());
  EXPECT_EQ(stream->Sent(1), (std::vector<int64_t>{11}));
  link.Close(absl::CancelledError("done"));
}

TEST(NeighbourLinkTest, AReplacementCatchesUpBeforeItSendsAgain) {
  NeighbourLink link({.name = "stage 2", .replay = true});
  auto stream = std::make_shared<FakeStream>();
  link.Attach(stream, 3);  // the neighbour holds 3 of the lost stage's messages
  EXPECT_TRUE(link.CatchingUp());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(link.Send(Forward(i), i).ok());
  EXPECT_FALSE(link.CatchingUp());
  ASSERT_TRUE(link.Send(Forward(3), 3).ok());
  EXPECT_EQ(stream->Sent(1), (std::vector<int64_t>{4}));  // only what it does not hold
  link.Close(absl::CancelledError("done"));
}

TEST(NeighbourLinkTest, ACommittedCheckpointDropsWhatCameBeforeIt) {
  absl::Mutex mu;
  absl::Status failed;
  NeighbourLink link({.name = "stage 1", .replay = true, .on_error = [&](const absl::Status& s) {
                        absl::MutexLock lock(&mu);
                        failed = s;
                      }});
  auto stream = std::make_shared<FakeStream>();
  link.Attach(stream, 0);
  for (int step = 0; step < 10; ++step) ASSERT_TRUE(link.Send(Forward(step), step).ok());
  stream->Sent(10);
  link.Flush();
  link.Trim(6);  // keeps steps 5.. (the checkpoint after 6 steps, and one before)
  EXPECT_EQ(link.kept_messages(), 5);
  // A peer that asks for message 2 again cannot have it.
  auto again = std::make_shared<FakeStream>();
  link.Attach(again, 1);
  absl::MutexLock lock(&mu);
  mu.AwaitWithTimeout(absl::Condition(
                          +[](absl::Status* s) { return !s->ok(); }, &failed),
                      absl::Seconds(10));
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_NE(failed.message().find("message 2"), std::string::npos) << failed;
}

}  // namespace
}  // namespace stagewise::worker
