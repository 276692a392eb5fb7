// The write side of one gRPC stream, shared by every stagewise reactor: a
// bounded queue of outgoing messages with at most one write in flight, and
// Finish once the queued writes are out. It knows nothing of gRPC: the owner
// injects how to start a write and how to finish, and reports back when a
// write completed and when the transport is done with the stream, so unit
// tests drive it by hand.
//
//   Outbox<v1::Command> outbox("control", 64,
//       {[this](const v1::Command* c) { StartWrite(c); },
//        [this](const absl::Status& s) { Finish(rpc::ToGrpcStatus(s)); }});
//   void OnWriteDone(bool ok) override { outbox.OnWriteDone(ok); }
//   void OnDone() override { outbox.OnDone(absl::OkStatus()); ... }
//
// Lifecycle (one transition function, TransitionLocked, is the only writer):
//
//   kOpen --Close / write failed--> kClosing --drained, no hold--> kFinishing
//        \                                                              |
//         `------------------ OnDone (the call ended) ------------------+--> kDone
//
// A message is "in flight" from the moment it becomes the queue's front until
// OnWriteDone pops it: while the stream is open or closing, a write is in
// flight exactly when the queue is not empty. The hooks run outside the lock,
// never concurrently with each other for writes, and `finish` exactly once.
#ifndef STAGEWISE_SERVICES_RPC_OUTBOX_H_
#define STAGEWISE_SERVICES_RPC_OUTBOX_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace stagewise::rpc {

enum class OutboxState {
  kOpen,       // messages are accepted
  kClosing,    // no new messages; queued writes drain, then `finish`
  kFinishing,  // `finish` has run; waiting for the transport's OnDone
  kDone,       // the transport is done with the stream (terminal)
};

absl::string_view OutboxStateName(OutboxState state);
// The lifecycle's edges (see the diagram above); anything else is a bug.
bool IsLegalOutboxTransition(OutboxState from, OutboxState to);
// Logs an illegal transition (the outbox then keeps its current state).
void ReportIllegalOutboxTransition(absl::string_view name, OutboxState from, OutboxState to);

template <typename T>
class Outbox {
 public:
  using State = OutboxState;

  struct Hooks {
    // Starts writing `*message` (stable until the matching OnWriteDone). At
    // most one write is outstanding. Must not block.
    std::function<void(const T* message)> start_write;
    // Ends the stream with `status` (server: Finish; client: WritesDone or
    // cancel). Runs exactly once, after the last write completed. Must not block.
    std::function<void(const absl::Status& status)> finish;
  };

  // `capacity` bounds the queued messages, the one in flight included (0 acts as 1).
  Outbox(std::string name, size_t capacity, Hooks hooks)
      : name_(std::move(name)), capacity_(capacity == 0 ? 1 : capacity), hooks_(std::move(hooks)) {}
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  // ---- producers -----------------------------------------------------------

  // Blocks while the queue is full. Fails once the stream is closing
  // (FAILED_PRECONDITION) or done (its final status). When a write failed the
  // stream is broken: waits until the transport is done, then reports why.
  absl::Status Send(T message) {
    const T* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      ++blocked_senders_;
      mu_.Await(absl::Condition(this, &Outbox::OpenWithRoomOrNotOpen));
      --blocked_senders_;
      if (state_ != State::kOpen) return RefusalLocked(/*wait_if_broken=*/true);
      start = EnqueueLocked(std::move(message));
    }
    if (start != nullptr) hooks_.start_write(start);
    return absl::OkStatus();
  }

  // Never blocks (for reactors and listeners). RESOURCE_EXHAUSTED when full
  // (the stream stays open: the caller decides, e.g. to close it); otherwise
  // like Send, except that a broken stream fails at once.
  absl::Status TrySend(T message) { return TryEnqueue(std::move(message), /*replace=*/false); }

  // Like TrySend, but when full replaces the newest queued message that is not
  // yet being written (progress updates that supersede each other). Still
  // RESOURCE_EXHAUSTED when the only queued message is the one in flight.
  absl::Status TrySendOrReplace(T message) {
    return TryEnqueue(std::move(message), /*replace=*/true);
  }

  // No more messages. OK: queued writes go out, then `finish(OK)`. An error
  // drops the queued writes not yet started (the one in flight completes
  // first) and finishes with it. Blocked senders fail. Only the first call
  // (or a failed write, whichever comes first) chooses the final status.
  void Close(const absl::Status& status) {
    bool finish = false;
    absl::Status finish_status;
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kOpen) return;
      finish_status_ = status;
      if (!status.ok() && queue_.size() > 1) queue_.erase(queue_.begin() + 1, queue_.end());
      TransitionLocked(State::kClosing);
      finish = MaybeFinishLocked(&finish_status);
    }
    if (finish) hooks_.finish(finish_status);
  }

  // Keeps `finish` from running while the owner starts an operation outside
  // a reaction (e.g. a read from another thread) that must not race with it.
  // False once `finish` has run: the operation must then not be started.
  // Every true must be paired with ReleaseHold.
  bool AcquireHold() {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kFinishing || state_ == State::kDone) return false;
    ++holds_;
    return true;
  }
  void ReleaseHold() {
    bool finish = false;
    absl::Status finish_status;
    {
      absl::MutexLock lock(&mu_);
      --holds_;
      finish = MaybeFinishLocked(&finish_status);
    }
    if (finish) hooks_.finish(finish_status);
  }

  // ---- transport events ----------------------------------------------------

  // The write started by `start_write` completed; !ok breaks the stream (the
  // call is over): queued writes are dropped and the stream finishes.
  void OnWriteDone(bool ok) {
    const T* next = nullptr;
    bool finish = false;
    absl::Status finish_status;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        ReportUnexpected("OnWriteDone without a write in flight");
        return;
      }
      queue_.pop_front();
      if (!ok) {
        broken_ =
            absl::UnavailableError(absl::StrCat(name_, ": the stream broke (a write failed)"));
        queue_.clear();
        if (state_ == State::kOpen) {
          finish_status_ = broken_;
          TransitionLocked(State::kClosing);
        }
      }
      if (!queue_.empty()) next = &queue_.front();
      finish = MaybeFinishLocked(&finish_status);
    }
    if (next != nullptr) hooks_.start_write(next);
    if (finish) hooks_.finish(finish_status);
  }

  // The transport is done with the stream (normally after `finish`; earlier
  // when the call was torn down). `status` is the call's final status; later
  // sends fail with it (FAILED_PRECONDITION "stream ended" when it is OK).
  void OnDone(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kDone) {
      ReportUnexpected("OnDone twice");
      return;
    }
    if (!broken_.ok()) {
      final_ = absl::UnavailableError(
          absl::StrCat(name_, ": the stream broke (", status.ToString(), ")"));
    } else if (status.ok()) {
      final_ = absl::FailedPreconditionError(absl::StrCat(name_, ": stream ended"));
    } else {
      final_ = status;
    }
    // Whatever is still queued stays until destruction: a producer that just
    // queued the first message may be about to hand it to `start_write`.
    TransitionLocked(State::kDone);
  }

  // ---- observers -----------------------------------------------------------

  // Blocks until OnDone.
  void WaitDone() const {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Outbox::IsDone));
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return state_ == State::kDone;
  }
  State state() const {
    absl::MutexLock lock(&mu_);
    return state_;
  }
  // Queued messages, the one in flight included (once done: left over).
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }
  // Producers waiting in Send (for tests and diagnostics).
  int blocked_senders() const {
    absl::MutexLock lock(&mu_);
    return blocked_senders_;
  }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

 private:
  absl::Status TryEnqueue(T message, bool replace) {
    const T* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (state_ != State::kOpen) return RefusalLocked(/*wait_if_broken=*/false);
      if (queue_.size() >= capacity_) {
        // The front is in flight; anything behind it may still be replaced.
        if (!replace || queue_.size() < 2) {
          return absl::ResourceExhaustedError(
              absl::StrCat(name_, ": outbox full (", capacity_, " messages)"));
        }
        queue_.back() = std::move(message);
        return absl::OkStatus();
      }
      start = EnqueueLocked(std::move(message));
    }
    if (start != nullptr) hooks_.start_write(start);
    return absl::OkStatus();
  }

  // Appends; returns the message to start writing when none was in flight.
  const T* EnqueueLocked(T message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queue_.push_back(std::move(message));
    // deque::push_back never moves existing elements: the pointer stays valid.
    return queue_.size() == 1 ? &queue_.front() : nullptr;
  }

  // Why a message is refused once the stream is no longer open.
  absl::Status RefusalLocked(bool wait_if_broken) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (state_ != State::kDone && !broken_.ok()) {
      if (!wait_if_broken) return broken_;
      // Report the call's final status, not just that it broke.
      mu_.Await(absl::Condition(this, &Outbox::IsDone));
    }
    if (state_ == State::kDone) return final_;
    return absl::FailedPreconditionError(absl::StrCat(name_, ": stream is closing"));
  }

  // kClosing -> kFinishing once nothing is in flight and no hold is out.
  bool MaybeFinishLocked(absl::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (state_ != State::kClosing || !queue_.empty() || holds_ > 0) return false;
    TransitionLocked(State::kFinishing);
    *status = finish_status_;
    return true;
  }

  void TransitionLocked(State next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!IsLegalOutboxTransition(state_, next)) {
      ReportIllegalOutboxTransition(name_, state_, next);
      return;
    }
    state_ = next;
  }

  void ReportUnexpected(absl::string_view what) const;

  bool OpenWithRoomOrNotOpen() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != State::kOpen || queue_.size() < capacity_;
  }
  bool IsDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ == State::kDone; }

  const std::string name_;
  const size_t capacity_;
  const Hooks hooks_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kOpen;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  int blocked_senders_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);  // what `finish` reports
  absl::Status broken_ ABSL_GUARDED_BY(mu_);         // non-OK once a write failed
  absl::Status final_ ABSL_GUARDED_BY(mu_);          // what sends get once done
};

void ReportUnexpectedOutboxEvent(absl::string_view name, absl::string_view what);

template <typename T>
void Outbox<T>::ReportUnexpected(absl::string_view what) const {
  ReportUnexpectedOutboxEvent(name_, what);
}

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_OUTBOX_H_
