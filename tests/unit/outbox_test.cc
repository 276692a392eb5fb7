// rpc::Outbox alone: the transport is a fake the tests drive by hand (write
// done ok/failed, done), from one thread or several.
#include "services/rpc/outbox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace stagewise::rpc {
namespace {

using State = OutboxState;

// Polls `ready` until it holds or a generous deadline passes (then false: the
// test fails instead of hanging). Not a timing assertion: only the outcome counts.
bool Eventually(const std::function<bool()>& ready) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!ready()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Records what the outbox asks of the transport; tests complete writes by hand.
class ManualTransport {
 public:
  Outbox<int>::Hooks Hooks() {
    return {[this](const int* message) {
              absl::MutexLock lock(&mu_);
              started_.push_back(*message);
              ++in_flight_;
              max_in_flight_ = std::max(max_in_flight_, in_flight_);
            },
            [this](const absl::Status& status) {
              absl::MutexLock lock(&mu_);
              finished_.push_back(status);
            }};
  }
  // Completes the write in flight.
  void Complete(Outbox<int>& outbox, bool ok) {
    {
      absl::MutexLock lock(&mu_);
      --in_flight_;
    }
    outbox.OnWriteDone(ok);
  }
  std::vector<int> started() const {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  std::vector<absl::Status> finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  int max_in_flight() const {
    absl::MutexLock lock(&mu_);
    return max_in_flight_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int> started_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> finished_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(OutboxTest, OneWriteInFlightAtATimeInOrder) {
  ManualTransport t;
  Outbox<int> outbox("test", 8, t.Hooks());
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(outbox.Send(i).ok());
  EXPECT_EQ(t.started(), std::vector<int>({1}));
  EXPECT_EQ(outbox.size(), 5u);
  for (int done = 1; done <= 4; ++done) {
    t.Complete(outbox, true);
    ASSERT_EQ(t.started().size(), static_cast<size_t>(done + 1));
    EXPECT_EQ(t.started().back(), done + 1);
  }
  t.Complete(outbox, true);
  EXPECT_EQ(t.started(), std::vector<int>({1, 2, 3, 4, 5}));
  EXPECT_EQ(t.max_in_flight(), 1);
  EXPECT_EQ(outbox.size(), 0u);
  // Idle again: the next message starts at once.
  ASSERT_TRUE(outbox.Send(6).ok());
  EXPECT_EQ(t.started().back(), 6);
  EXPECT_TRUE(t.finished().empty());
  EXPECT_EQ(outbox.state(), State::kOpen);
}

TEST(OutboxTest, BackPressureBlocksSendAtCapacityAndReleasesOnWriteDone) {
  ManualTransport t;
  Outbox<int> outbox("test", 2, t.Hooks());
  ASSERT_TRUE(outbox.Send(1).ok());
  ASSERT_TRUE(outbox.Send(2).ok());
  absl::Notification returned;
  absl::Status third;
  std::thread sender([&] {
    third = outbox.Send(3);
    returned.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return outbox.blocked_senders() == 1; }));
  // Blocked inside Send (it counted itself there), so it cannot have returned.
  EXPECT_FALSE(returned.HasBeenNotified());
  EXPECT_EQ(outbox.size(), 2u);
  t.Complete(outbox, true);  // frees one slot
  returned.WaitForNotification();
  sender.join();
  EXPECT_TRUE(third.ok()) << third;
  EXPECT_EQ(outbox.blocked_senders(), 0);
  t.Complete(outbox, true);
  t.Complete(outbox, true);
  EXPECT_EQ(t.started(), std::vector<int>({1, 2, 3}));
  EXPECT_EQ(t.max_in_flight(), 1);
}

TEST(OutboxTest, TrySendReportsFullWithoutBlocking) {
  ManualTransport t;
  Outbox<int> outbox("test", 2, t.Hooks());
  ASSERT_TRUE(outbox.TrySend(1).ok());
  ASSERT_TRUE(outbox.TrySend(2).ok());
  absl::Status full = outbox.TrySend(3);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(outbox.state(), State::kOpen);  // the caller decides what to do
  t.Complete(outbox, true);
  EXPECT_TRUE(outbox.TrySend(3).ok());
  t.Complete(outbox, true);
  t.Complete(outbox, true);
  EXPECT_EQ(t.started(), std::vector<int>({1, 2, 3}));
}

TEST(OutboxTest, TrySendOrReplaceReplacesOnlyMessagesNotYetWritten) {
  ManualTransport t;
  Outbox<int> outbox("test", 2, t.Hooks());
  ASSERT_TRUE(outbox.TrySendOrReplace(1).ok());  // in flight
  ASSERT_TRUE(outbox.TrySendOrReplace(2).ok());  // waiting
  ASSERT_TRUE(outbox.TrySendOrReplace(3).ok());  // replaces 2
  ASSERT_TRUE(outbox.TrySendOrReplace(4).ok());  // replaces 3
  EXPECT_EQ(outbox.size(), 2u);
  t.Complete(outbox, true);
  t.Complete(outbox, true);
  EXPECT_EQ(t.started(), std::vector<int>({1, 4}));

  // With room for one message only the one in flight is queued: nothing to replace.
  ManualTransport t1;
  Outbox<int> single("single", 1, t1.Hooks());
  ASSERT_TRUE(single.TrySendOrReplace(1).ok());
  EXPECT_EQ(single.TrySendOrReplace(2).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t1.started(), std::vector<int>({1}));
}

TEST(OutboxTest, CloseDrainsQueuedWritesThenFinishesExactlyOnce) {
  ManualTransport t;
  Outbox<int> outbox("test", 4, t.Hooks());
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(outbox.Send(i).ok());
  outbox.Close(absl::OkStatus());
  EXPECT_EQ(outbox.state(), State::kClosing);
  EXPECT_EQ(outbox.Send(9).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(outbox.TrySend(9).code(), absl::StatusCode::kFailedPrecondition);
  t.Complete(outbox, true);
  t.Complete(outbox, true);
  EXPECT_TRUE(t.finished().empty());  // one write still out
  t.Complete(outbox, true);
  ASSERT_EQ(t.finished().size(), 1u);
  EXPECT_TRUE(t.finished()[0].ok());
  EXPECT_EQ(outbox.state(), State::kFinishing);
  outbox.Close(absl::InternalError("again"));  // ignored: the first Close chose
  EXPECT_EQ(t.finished().size(), 1u);
  EXPECT_EQ(t.started(), std::vector<int>({1, 2, 3}));
  EXPECT_FALSE(outbox.done());
  outbox.OnDone(absl::OkStatus());
  EXPECT_TRUE(outbox.done());
  outbox.WaitDone();
  EXPECT_EQ(outbox.Send(9).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.finished().size(), 1u);
}

TEST(OutboxTest, CloseWhenIdleFinishesAtOnce) {
  ManualTransport t;
  Outbox<int> outbox("test", 4, t.Hooks());
  outbox.Close(absl::InternalError("bye"));
  ASSERT_EQ(t.finished().size(), 1u);
  EXPECT_EQ(t.finished()[0].code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(t.started().empty());
}

TEST(OutboxTest, CloseWithErrorDropsWritesNotStarted) {
  ManualTransport t;
  Outbox<int> outbox("test", 4, t.Hooks());
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(outbox.Send(i).ok());
  outbox.Close(absl::CancelledError("stop"));
  EXPECT_EQ(outbox.size(), 1u);       // only the write in flight is left
  EXPECT_TRUE(t.finished().empty());  // it must complete before Finish
  t.Complete(outbox, true);
  ASSERT_EQ(t.finished().size(), 1u);
  EXPECT_EQ(t.finished()[0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(t.started(), std::vector<int>({1}));
}

TEST(OutboxTest, CloseWakesBlockedSenderWithError) {
  ManualTransport t;
  Outbox<int> outbox("test", 1, t.Hooks());
  ASSERT_TRUE(outbox.Send(1).ok());
  absl::Status blocked;
  std::thread sender([&] { blocked = outbox.Send(2); });
  ASSERT_TRUE(Eventually([&] { return outbox.blocked_senders() == 1; }));
  outbox.Close(absl::CancelledError("shutting down"));
  sender.join();
  EXPECT_EQ(blocked.code(), absl::StatusCode::kFailedPrecondition) << blocked;
  t.Complete(outbox, true);
  ASSERT_EQ(t.finished().size(), 1u);
  EXPECT_EQ(t.started(), std::vector<int>({1}));
}

TEST(OutboxTest, WriteFailureBreaksTheStreamAndFailsLaterSends) {
  ManualTransport t;
  Outbox<int> outbox("test", 4, t.Hooks());
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(outbox.Send(i).ok());
  t.Complete(outbox, false);
  // Queued writes are dropped and the stream finishes with why it broke.
  EXPECT_EQ(outbox.size(), 0u);
  EXPECT_EQ(t.started(), std::vector<int>({1}));
  ASSERT_EQ(t.finished().size(), 1u);
  EXPECT_EQ(t.finished()[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(outbox.TrySend(4).code(), absl::StatusCode::kUnavailable);
  // A blocking Send waits for the call's final status and reports it.
  absl::Status late;
  absl::Notification returned;
  std::thread sender([&] {
    late = outbox.Send(5);
    returned.Notify();
  });
  outbox.OnDone(absl::DeadlineExceededError("peer gone"));
  returned.WaitForNotification();
  sender.join();
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  EXPECT_NE(late.message().find("peer gone"), absl::string_view::npos) << late;
  EXPECT_EQ(outbox.Send(6).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(t.finished().size(), 1u);
}

TEST(OutboxTest, WriteFailureWhileClosingKeepsTheCloseStatus) {
  ManualTransport t;
  Outbox<int> outbox("test", 4, t.Hooks());
  ASSERT_TRUE(outbox.Send(1).ok());
  ASSERT_TRUE(outbox.Send(2).ok());
  outbox.Close(absl::OkStatus());
  t.Complete(outbox, false);
  ASSERT_EQ(t.finished().size(), 1u);
  EXPECT_TRUE(t.finished()[0].ok());
  EXPECT_EQ(t.started(), std::vector<int>({1}));
}

TEST(OutboxTest, DoneBeforeFinishWakesBlockedSendersWithTheFinalStatus) {
  ManualTransport t;
  Outbox<int> outbox("test", 1, t.Hooks());
  ASSERT_TRUE(outbox.Send(1).ok());
  std::vector<absl::Status> results(3);
  std::vector<std::thread> senders;
  for (int i = 0; i < 3; ++i) senders.emplace_back([&, i] { results[i] = outbox.Send(10 + i); });
  ASSERT_TRUE(Eventually([&] { return outbox.blocked_senders() == 3; }));
  outbox.OnDone(absl::CancelledError("the call was cancelled"));  // torn down under us
  for (auto& s : senders) s.join();
  for (const auto& r : results) EXPECT_EQ(r.code(), absl::StatusCode::kCancelled) << r;
  EXPECT_TRUE(outbox.done());
  EXPECT_TRUE(t.finished().empty());
  outbox.Close(absl::OkStatus());  // too late: nothing happens
  EXPECT_TRUE(t.finished().empty());
  EXPECT_FALSE(outbox.AcquireHold());
}

TEST(OutboxTest, HoldDefersFinishUntilReleased) {
  ManualTransport t;
  Outbox<int> outbox("test", 2, t.Hooks());
  ASSERT_TRUE(outbox.AcquireHold());
  ASSERT_TRUE(outbox.AcquireHold());
  outbox.Close(absl::OkStatus());
  EXPECT_TRUE(t.finished().empty());
  outbox.ReleaseHold();
  EXPECT_TRUE(t.finished().empty());
  EXPECT_TRUE(outbox.AcquireHold());  // still closing: holds are granted
  outbox.ReleaseHold();
  outbox.ReleaseHold();
  ASSERT_EQ(t.finished().size(), 1u);
  EXPECT_FALSE(outbox.AcquireHold());  // finish ran: the operation must not start
}

TEST(OutboxTest, UnexpectedTransportEventsAreIgnored) {
  ManualTransport t;
  Outbox<int> outbox("test", 2, t.Hooks());
  outbox.OnWriteDone(true);  // nothing in flight
  EXPECT_EQ(outbox.state(), State::kOpen);
  ASSERT_TRUE(outbox.Send(1).ok());
  EXPECT_EQ(t.started(), std::vector<int>({1}));
  outbox.OnDone(absl::OkStatus());
  outbox.OnDone(absl::InternalError("twice"));
  EXPECT_EQ(outbox.Send(2).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(OutboxTest, TransitionTable) {
  const State all[] = {State::kOpen, State::kClosing, State::kFinishing, State::kDone};
  std::map<std::pair<State, State>, bool> legal;
  for (State from : all) {
    for (State to : all) legal[{from, to}] = IsLegalOutboxTransition(from, to);
  }
  EXPECT_TRUE((legal[{State::kOpen, State::kClosing}]));
  EXPECT_TRUE((legal[{State::kClosing, State::kFinishing}]));
  EXPECT_TRUE((legal[{State::kFinishing, State::kDone}]));
  EXPECT_TRUE((legal[{State::kOpen, State::kDone}]));
  EXPECT_TRUE((legal[{State::kClosing, State::kDone}]));
  int count = 0;
  for (const auto& [edge, ok] : legal) count += ok ? 1 : 0;
  EXPECT_EQ(count, 5);
  EXPECT_EQ(OutboxStateName(State::kFinishing), "FINISHING");
}

// ---- teardown races ---------------------------------------------------------

// A transport on its own thread: completes writes in order (failing the
// `fail_at`-th when asked), checks that writes never overlap and that finish
// never runs while a hold is out, and reports done once finished (or, when
// `cancel_at` is set, tears the call down after that many writes).
class ThreadedTransport {
 public:
  ThreadedTransport(int fail_at, int cancel_at) : fail_at_(fail_at), cancel_at_(cancel_at) {}

  Outbox<int>::Hooks Hooks() {
    return {[this](const int* message) {
              absl::MutexLock lock(&mu_);
              if (pending_.has_value()) ++violations_;
              pending_ = *message;
            },
            [this](const absl::Status& status) {
              if (holders_.load() != 0) violations_.fetch_add(1);
              absl::MutexLock lock(&mu_);
              ++finishes_;
              finish_status_ = status;
            }};
  }

  void Run(Outbox<int>* outbox) {
    int completed = 0;
    while (true) {
      std::optional<int> write;
      absl::Status done_status;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &ThreadedTransport::HasWork));
        if (cancel_at_ >= 0 && completed >= cancel_at_) {
          done_status = absl::CancelledError("torn down");
        } else if (pending_.has_value()) {
          write = pending_;
          written_.push_back(*pending_);
        } else {
          done_status = finish_status_.ok() ? absl::OkStatus() : finish_status_;
        }
      }
      if (!write.has_value()) {
        outbox->OnDone(done_status);
        return;
      }
      const bool ok = completed != fail_at_;
      ++completed;
      {
        absl::MutexLock lock(&mu_);
        pending_.reset();  // before OnWriteDone: it may start the next write
      }
      outbox->OnWriteDone(ok);
    }
  }

  std::atomic<int>& holders() { return holders_; }
  int violations() const { return violations_.load(); }
  int finishes() const {
    absl::MutexLock lock(&mu_);
    return finishes_;
  }
  std::vector<int> written() const {
    absl::MutexLock lock(&mu_);
    return written_;
  }

 private:
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.has_value() || finishes_ > 0;
  }

  const int fail_at_;
  const int cancel_at_;
  std::atomic<int> holders_{0};
  std::atomic<int> violations_{0};
  mutable absl::Mutex mu_;
  std::optional<int> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<int> written_ ABSL_GUARDED_BY(mu_);
  int finishes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

enum class Teardown { kCloseOk, kCloseError, kWriteFails, kCancelled };

// Producers, a closer, a reader taking holds and the transport, all at once.
void RunRace(Teardown teardown, int iteration) {
  constexpr int kProducers = 4;
  constexpr int kPerProducer = 40;
  const int close_after = iteration % 37;  // how many writes the closer waits for
  ThreadedTransport transport(teardown == Teardown::kWriteFails ? iteration % 23 : -1,
                              teardown == Teardown::kCancelled ? iteration % 29 : -1);
  Outbox<int> outbox("race", 1 + iteration % 4, transport.Hooks());
  std::thread transport_thread([&] { transport.Run(&outbox); });

  std::vector<std::vector<int>> accepted(kProducers);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        const int value = p * 1000 + i;
        const absl::Status s = (i % 5 == 4) ? outbox.TrySend(value) : outbox.Send(value);
        if (s.ok()) {
          accepted[p].push_back(value);
        } else if (!absl::IsResourceExhausted(s)) {
          return;  // closed or broken: every later send fails too
        }
      }
    });
  }
  std::atomic<bool> stop_reader{false};
  std::thread reader([&] {
    while (!stop_reader.load()) {
      if (!outbox.AcquireHold()) return;
      transport.holders().fetch_add(1);
      transport.holders().fetch_sub(1);
      outbox.ReleaseHold();
      std::this_thread::yield();
    }
  });
  std::thread closer([&] {
    Eventually([&] {
      return static_cast<int>(transport.written().size()) >= close_after || outbox.done() ||
             outbox.state() != State::kOpen;
    });
    outbox.Close(teardown == Teardown::kCloseError ? absl::AbortedError("stop") : absl::OkStatus());
  });

  closer.join();
  for (auto& t : producers) t.join();
  stop_reader = true;
  reader.join();
  transport_thread.join();

  ASSERT_TRUE(outbox.done());
  EXPECT_EQ(transport.violations(), 0);
  EXPECT_LE(transport.finishes(), 1);
  if (teardown != Teardown::kCancelled) {
    EXPECT_EQ(transport.finishes(), 1);
  }
  EXPECT_FALSE(outbox.Send(1).ok());
  EXPECT_EQ(outbox.blocked_senders(), 0);

  // Written messages were accepted, each once, in each producer's order.
  const std::vector<int> written = transport.written();
  std::vector<std::vector<int>> by_producer(kProducers);
  for (int v : written) by_producer[v / 1000].push_back(v);
  size_t total_accepted = 0;
  for (int p = 0; p < kProducers; ++p) {
    total_accepted += accepted[p].size();
    ASSERT_LE(by_producer[p].size(), accepted[p].size());
    for (size_t i = 0; i < by_producer[p].size(); ++i) {
      ASSERT_EQ(by_producer[p][i], accepted[p][i]) << "producer " << p << " message " << i;
    }
  }
  if (teardown == Teardown::kCloseOk) {
    EXPECT_EQ(written.size(), total_accepted);  // a clean close drains everything
  }
}

TEST(OutboxRaceTest, CloseOkDrainsEverythingAccepted) {
  for (int i = 0; i < 40; ++i) RunRace(Teardown::kCloseOk, i);
}

TEST(OutboxRaceTest, CloseWithErrorWhileSendersBlocked) {
  for (int i = 0; i < 40; ++i) RunRace(Teardown::kCloseError, i);
}

TEST(OutboxRaceTest, WriteFailureWhileSendersBlocked) {
  for (int i = 0; i < 40; ++i) RunRace(Teardown::kWriteFails, i);
}

TEST(OutboxRaceTest, TransportTearsDownWhileSendersBlocked) {
  for (int i = 0; i < 40; ++i) RunRace(Teardown::kCancelled, i);
}

}  // namespace
}  // namespace stagewise::rpc
