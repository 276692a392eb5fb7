#include "worker/link_delay.h"

#include <utility>

#include "absl/status/status.h"

namespace stagewise::worker {

LinkDelay::LinkDelay(absl::Duration delay, size_t max_messages, int64_t max_bytes,
                     std::function<bool(v1::StageMessage)> pass)
    : delay_(delay),
      max_messages_(max_messages == 0 ? 1 : max_messages),
      max_bytes_(max_bytes < 1 ? 1 : max_bytes),
      pass_(std::move(pass)),
      thread_([this] { Run(); }) {}

LinkDelay::~LinkDelay() {
  Close();
  thread_.join();
}

absl::StatusOr<bool> LinkDelay::Hold(v1::StageMessage message, std::function<void()> resume) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::CancelledError("the stage is no longer running this job");
  const auto bytes = static_cast<int64_t>(message.ByteSizeLong());
  held_.push_back({absl::Now() + delay_, bytes, std::move(message)});
  held_bytes_ += bytes;
  if (held_.size() < max_messages_ && held_bytes_ < max_bytes_) return true;
  resume_ = std::move(resume);  // full: the stream pauses until one leaves
  return false;
}

void LinkDelay::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  held_.clear();
  held_bytes_ = 0;
  resume_ = nullptr;
}

size_t LinkDelay::held() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

void LinkDelay::Run() {
  for (;;) {
    v1::StageMessage next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &LinkDelay::HasHeldOrClosed));
      // The head is due first: the delay is the same for every message and
      // they were held in order.
      while (!closed_ && absl::Now() < held_.front().due) {
        mu_.AwaitWithDeadline(absl::Condition(&closed_), held_.front().due);
      }
      if (closed_) return;
      next = std::move(held_.front().message);
      held_bytes_ -= held_.front().bytes;
      held_.pop_front();
    }
    // A full inbox blocks here, and so the stream stays paused.
    if (!pass_(std::move(next))) {
      Close();
      return;
    }
    std::function<void()> resume;
    {
      absl::MutexLock lock(&mu_);
      resume = std::exchange(resume_, nullptr);
    }
    if (resume) resume();
  }
}

}  // namespace stagewise::worker
