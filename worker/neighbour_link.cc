#include "worker/neighbour_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stagewise::worker {

NeighbourLink::NeighbourLink(Options options) : options_(std::move(options)) {
  if (options_.replay) pump_ = std::thread([this] { Pump(); });
}

NeighbourLink::~NeighbourLink() {
  Close(absl::CancelledError("the stage is gone"));
  if (pump_.joinable()) pump_.join();
}

void NeighbourLink::Resume(int64_t sent, int64_t taken) {
  absl::MutexLock lock(&mu_);
  sent_ = sent;
  taken_ = taken;
  held_ = taken;
  next_to_send_ = sent + 1;
}

void NeighbourLink::Attach(std::shared_ptr<PeerStream> stream, int64_t peer_holds) {
  absl::MutexLock lock(&mu_);
  streams_.push_back(stream);
  if (closed_) {
    stream->Close(close_status_);
    return;
  }
  stream_ = std::move(stream);
  ++generation_;
  peer_holds_ = peer_holds;
  // Without replay nothing is kept: the stream starts where this side is.
  next_to_send_ = options_.replay ? std::max<int64_t>(peer_holds, 0) + 1 : sent_ + 1;
}

bool NeighbourLink::Detach(const PeerStream* which) {
  if (!options_.replay) return false;
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr && stream_.get() == which) {
    stream_.reset();
    ++generation_;
  }
  return true;
}

void NeighbourLink::Flush() {
  if (!options_.replay) return;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &NeighbourLink::Flushed));
}

bool NeighbourLink::Flushed() const {
  return closed_ || stream_ == nullptr || next_to_send_ > sent_;
}

bool NeighbourLink::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

bool NeighbourLink::attached() const {
  absl::MutexLock lock(&mu_);
  return stream_ != nullptr;
}

absl::Status NeighbourLink::Send(v1::StageMessage message, int64_t step) {
  if (!options_.replay) {
    std::shared_ptr<PeerStream> stream;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return close_status_;
      stream = stream_;
      if (!stream) {
        return absl::FailedPreconditionError(absl::StrCat("no stream to ", options_.name, " yet"));
      }
      message.set_seq(++sent_);
    }
    return stream->Send(std::move(message));
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &NeighbourLink::HasRoom));
  if (closed_) return close_status_;
  message.set_seq(++sent_);
  kept_bytes_ += static_cast<int64_t>(message.ByteSizeLong());
  kept_.push_back({sent_, step, std::move(message)});
  return absl::OkStatus();
}

absl::StatusOr<bool> NeighbourLink::Arrived(int64_t seq) {
  if (seq <= 0) return true;
  absl::MutexLock lock(&mu_);
  if (!options_.replay) {
    held_ = std::max(held_, seq);
    return true;
  }
  if (seq <= held_) return false;
  if (seq != held_ + 1) {
    return absl::DataLossError(absl::StrCat("StageMessage.seq: ", seq, " from ", options_.name,
                                            " after ", held_, " (messages are missing)"));
  }
  held_ = seq;
  return true;
}

void NeighbourLink::Took(int64_t seq) {
  if (seq <= 0) return;
  absl::MutexLock lock(&mu_);
  taken_ = std::max(taken_, seq);
}

void NeighbourLink::Trim(int64_t step) {
  absl::MutexLock lock(&mu_);
  while (!kept_.empty() && kept_.front().step < step - 1 && kept_.front().seq < next_to_send_) {
    kept_bytes_ -= static_cast<int64_t>(kept_.front().message.ByteSizeLong());
    kept_.pop_front();
  }
}

int64_t NeighbourLink::sent() const {
  absl::MutexLock lock(&mu_);
  return sent_;
}

int64_t NeighbourLink::taken() const {
  absl::MutexLock lock(&mu_);
  return taken_;
}

int64_t NeighbourLink::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

int64_t NeighbourLink::kept_messages() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(kept_.size());
}

int64_t NeighbourLink::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

bool NeighbourLink::CatchingUp() const {
  absl::MutexLock lock(&mu_);
  return stream_ != nullptr && sent_ < peer_holds_;
}

void NeighbourLink::Close(const absl::Status& why) {
  std::shared_ptr<PeerStream> stream;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    close_status_ = why.ok() ? absl::CancelledError("closed") : why;
    stream = std::move(stream_);
    ++generation_;
  }
  if (stream) stream->Close(why);
}

void NeighbourLink::WaitDone() {
  if (pump_.joinable()) pump_.join();
  std::vector<std::shared_ptr<PeerStream>> streams;
  {
    absl::MutexLock lock(&mu_);
    streams = streams_;
  }
  for (const auto& s : streams) s->WaitDone();
}

bool NeighbourLink::HasRoom() const {
  // Backpressure while a stream takes them; none while the peer is gone.
  return closed_ || stream_ == nullptr ||
         sent_ + 1 - next_to_send_ < static_cast<int64_t>(options_.max_unsent);
}

bool NeighbourLink::PumpReady() const {
  return closed_ || (stream_ != nullptr && next_to_send_ <= sent_);
}

void NeighbourLink::Pump() {
  mu_.Lock();
  while (true) {
    mu_.Await(absl::Condition(this, &NeighbourLink::PumpReady));
    if (closed_) break;
    if (kept_.empty() || kept_.front().seq > next_to_send_) {
      const absl::Status lost = absl::DataLossError(absl::StrCat(
          options_.name, " asks for message ", next_to_send_, " again, but this stage kept only ",
          kept_.empty() ? std::string("none") : absl::StrCat(kept_.front().seq, "..", sent_),
          " (dropped at a committed checkpoint)"));
      closed_ = true;
      close_status_ = lost;
      mu_.Unlock();
      if (options_.on_error) options_.on_error(lost);
      return;
    }
    v1::StageMessage copy = kept_[static_cast<size_t>(next_to_send_ - kept_.front().seq)].message;
    std::shared_ptr<PeerStream> stream = stream_;
    const int64_t generation = generation_;
    mu_.Unlock();
    const absl::Status sent = stream->Send(std::move(copy));
    mu_.Lock();
    if (generation != generation_) continue;  // detached or attached again meanwhile
    if (!sent.ok()) {
      // The stream is closing (its peer went away): keep the rest for the
      // next one.
      stream_.reset();
      ++generation_;
      continue;
    }
    ++next_to_send_;
  }
  mu_.Unlock();
}

}  // namespace stagewise::worker
