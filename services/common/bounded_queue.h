// A bounded multi-producer multi-consumer queue (a stage's inbox). Producers
// that must never block (gRPC reactors) ForcePush, check HasRoom and, when
// full, pause until the NotifyWhenRoom callback runs; producer threads that may
// block use Push. Consumers (the compute thread) block in Pop. Close() wakes
// everybody.
#ifndef STAGEWISE_SERVICES_COMMON_BOUNDED_QUEUE_H_
#define STAGEWISE_SERVICES_COMMON_BOUNDED_QUEUE_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagewise {

template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // Blocks while full. False once closed.
  bool Push(T item) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedQueue::HasRoomOrClosed));
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Appends even when full (by at most one item per producer in flight: the
  // caller stops producing until HasRoom). False once closed.
  bool ForcePush(T item) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Blocks until an item arrives, the queue is closed and drained (nullopt),
  // or `timeout` passes (nullopt).
  std::optional<T> Pop(absl::Duration timeout = absl::InfiniteDuration()) {
    std::function<void()> room;
    std::optional<T> out;
    {
      absl::MutexLock lock(&mu_);
      if (!mu_.AwaitWithTimeout(absl::Condition(this, &BoundedQueue::HasItemOrClosed), timeout)) {
        return std::nullopt;
      }
      if (items_.empty()) return std::nullopt;
      out = std::move(items_.front());
      items_.pop_front();
      if (on_room_ && items_.size() < capacity_) room = std::exchange(on_room_, nullptr);
    }
    if (room) room();  // outside the lock: it may push again
    return out;
  }

  // Runs `callback` once the queue has room (now, if it already has).
  void NotifyWhenRoom(std::function<void()> callback) {
    {
      absl::MutexLock lock(&mu_);
      if (items_.size() >= capacity_ && !closed_) {
        on_room_ = std::move(callback);
        return;
      }
    }
    callback();
  }

  bool HasRoom() const {
    absl::MutexLock lock(&mu_);
    return items_.size() < capacity_;
  }

  void Close() {
    std::function<void()> room;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      room = std::exchange(on_room_, nullptr);
    }
    if (room) room();
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return items_.size();
  }
  size_t capacity() const { return capacity_; }

 private:
  bool HasRoomOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || items_.size() < capacity_;
  }
  bool HasItemOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !items_.empty();
  }

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_room_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_BOUNDED_QUEUE_H_
