#include "worker/send_pipe.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/thread_slice.h"

namespace stagewise::worker {

absl::Status EncodeInto(v1::StageMessage* message, const std::vector<OutgoingTensor>& tensors) {
  // A tensor passed on as it came (a FORWARD's labels) may still be read in
  // place in the previous stage's ring: it goes on as a copy.
  for (auto& [name, proto] : *message->mutable_tensors()) {
    if (absl::Status s = InlineLentPayload(&proto); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("StageMessage.tensors['", name, "']: ", s.message()));
    }
  }
  for (const OutgoingTensor& t : tensors) {
    absl::Status s =
        EncodeTensor(t.tensor.detach(), &(*message->mutable_tensors())[t.name], t.wire);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("StageMessage.tensors['", t.name, "']: ", s.message()));
    }
  }
  return absl::OkStatus();
}

SendPipe::SendPipe(size_t capacity, Deliver deliver,
                   std::function<void(const absl::Status&)> on_error)
    : capacity_(capacity < 1 ? 1 : capacity),
      deliver_(std::move(deliver)),
      on_error_(std::move(on_error)) {}

SendPipe::~SendPipe() {
  Close(absl::CancelledError("the send pipe is closed"));
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

absl::Status SendPipe::Push(v1::StageMessage message, std::vector<OutgoingTensor> tensors,
                            int64_t step) {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return queue_.size() < capacity_ || !error_.ok();
  };
  mu_.Await(absl::Condition(&room));
  if (!error_.ok()) return error_;
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  queue_.push_back(Item{std::move(message), std::move(tensors), step});
  return absl::OkStatus();
}

absl::Status SendPipe::Drain() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (queue_.empty() && !busy_) || !error_.ok();
  };
  mu_.Await(absl::Condition(&drained));
  return error_;
}

void SendPipe::Close(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (error_.ok()) error_ = why.ok() ? absl::CancelledError("the send pipe is closed") : why;
  queue_.clear();
}

int64_t SendPipe::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size()) + (busy_ ? 1 : 0);
}

void SendPipe::Loop() {
  RequestThreadSlice();  // wakes onto a busy core at once (thread_slice.h)
  for (;;) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || !error_.ok(); };
      mu_.Await(absl::Condition(&ready));
      if (!error_.ok()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    absl::Status s = EncodeInto(&item.message, item.tensors);
    item.tensors.clear();  // the tensors are in the message (or the ring) now
    if (s.ok()) s = deliver_(std::move(item.message), item.step);
    bool first_failure = false;
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      if (!s.ok() && error_.ok()) {
        error_ = s;
        queue_.clear();
        first_failure = true;
      }
    }
    if (first_failure && on_error_) on_error_(s);
  }
}

}  // namespace stagewise::worker
