#include "worker/stage_streams.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "services/tensor/stage_message.h"

namespace stagewise::worker {
namespace {

// An emulated latency's window (worker/link_delay.h): what may be held at
// once, so at most 256 MiB per delay (10 GB/s at 25 ms) crosses the link.
constexpr size_t kDelayLineMessages = 4096;
constexpr int64_t kDelayLineBytes = int64_t{256} << 20;

}  // namespace

StageStreams::StageStreams(Setup setup, Hooks hooks)
    : setup_(std::move(setup)),
      hooks_(std::move(hooks)),
      from_prev_(setup_.inbox_capacity),
      from_next_(setup_.inbox_capacity),
      prev_ring_(setup_.replay ? "" : setup_.shared_memory_dir, setup_.shared_ring_bytes,
                 setup_.widen_on_receipt),
      next_ring_(setup_.replay ? "" : setup_.shared_memory_dir, setup_.shared_ring_bytes,
                 setup_.widen_on_receipt),
      prev_identity_(setup_.prev_identity) {
  for (const bool next : {false, true}) {
    NeighbourLink::Options o;
    o.name = absl::StrCat("stage ", setup_.stage + (next ? 1 : -1));
    o.replay = setup_.replay;
    o.max_unsent = setup_.outbox_capacity * 4;
    o.on_error = hooks_.fail;
    (next ? to_next_ : to_prev_) = std::make_unique<NeighbourLink>(std::move(o));
  }
  if (setup_.rpc.emulated_link_delay_ms > 0) {
    const absl::Duration delay = absl::Milliseconds(setup_.rpc.emulated_link_delay_ms);
    for (const bool from_prev : {true, false}) {
      BoundedQueue<v1::StageMessage>* inbox = from_prev ? &from_prev_ : &from_next_;
      auto pass = [this, inbox, from_prev](v1::StageMessage m) {
        const auto bytes = static_cast<int64_t>(m.ByteSizeLong()) + LentBytes(m);
        if (!inbox->Push(std::move(m))) return false;  // blocks while the inbox is full
        hooks_.received(bytes, from_prev);
        return true;
      };
      (from_prev ? prev_delay_ : next_delay_) =
          std::make_unique<LinkDelay>(delay, kDelayLineMessages, kDelayLineBytes, std::move(pass));
    }
  }
}

StageStreams::~StageStreams() {
  Close(absl::CancelledError("the stage is gone"));
  prev_delay_.reset();  // joins the lines' threads (they call hooks_)
  next_delay_.reset();
  to_next_->WaitDone();
  to_prev_->WaitDone();
}

void StageStreams::PrepareRing() {
  if (!first()) prev_ring_.Offer(false);
}

void StageStreams::Resume(const checkpoint::ShardPosition::Marks& marks) {
  to_next_->Resume(marks.sent_next, marks.taken_next);
  to_prev_->Resume(marks.sent_prev, marks.taken_prev);
}

checkpoint::ShardPosition::Marks StageStreams::marks() const {
  return {to_next_->sent(), to_prev_->sent(), to_prev_->taken(), to_next_->taken()};
}

std::unique_ptr<InboxSink> StageStreams::MakeSink(bool from_prev) {
  InboxSink::Hooks hooks;
  hooks.check = [this, from_prev](v1::StageMessage* m) {
    // Payloads in the peer's shared ring are copied out before any check.
    absl::Status s = (from_prev ? prev_ring_ : next_ring_).Resolve(m);
    return s.ok() ? hooks_.validate(*m, from_prev) : s;
  };
  hooks.handshake = [this, from_prev](const v1::StageMessage& m,
                                      const std::shared_ptr<PeerStream>& stream) {
    if (m.kind() == v1::StageMessage::RESUME) {
      // Stage j+1's answer to a resuming OPEN: what it holds of ours.
      to_next_->Attach(stream, m.held_seq());
      return;
    }
    SameHostLink& ring = from_prev ? prev_ring_ : next_ring_;
    ring.PeerAnswered(m.ring().opened_peer());
    // Stage j+1's answer to our OPEN: open its ring and say whether we could.
    if (!from_prev) {
      (void)stream->TrySend(
          RingMessage(setup_.job_id, setup_.attempt, ring.Offer(ring.Accept(m.ring()))));
    }
  };
  hooks.received = [this, from_prev](int64_t bytes) { hooks_.received(bytes, from_prev); };
  hooks.fail = hooks_.fail;
  return std::make_unique<InboxSink>(
      from_prev ? &from_prev_ : &from_next_, from_prev ? to_prev_.get() : to_next_.get(), from_prev,
      absl::StrCat("stage ", setup_.stage + (from_prev ? -1 : 1)), std::move(hooks),
      from_prev ? prev_delay_.get() : next_delay_.get());
}

absl::Status StageStreams::Dial(const std::string& address, bool resume) {
  std::unique_ptr<InboxSink> sink = MakeSink(false);
  std::shared_ptr<grpc::Channel> channel = rpc::MakeChannel(address, setup_.rpc);
  std::unique_ptr<v1::StageService::Stub> stub = v1::StageService::NewStub(channel);
  std::shared_ptr<DownstreamStream> stream =
      DownstreamStream::Open(stub.get(), sink.get(), setup_.outbox_capacity);
  sink->Bind(stream);
  std::shared_ptr<DownstreamStream> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::exchange(downstream_, stream);
    sinks_.push_back(std::move(sink));
    channels_.push_back(std::move(channel));
    stubs_.push_back(std::move(stub));
  }
  if (old) old->Close(absl::AbortedError("stage j+1 was replaced"));
  // Bind the stream on stage j+1 at once: it closes streams that stay silent.
  v1::StageMessage open;
  open.set_job_id(setup_.job_id);
  open.set_kind(v1::StageMessage::OPEN);
  open.set_attempt(setup_.attempt);
  open.set_origin_stage(setup_.stage);
  if (resume) {
    open.set_resume(true);
    open.set_held_seq(to_next_->held());
  } else {
    *open.mutable_ring() = next_ring_.Offer(false);
  }
  STAGEWISE_RETURN_IF_ERROR(stream->Send(std::move(open)));
  // A fresh stream starts where both sides are; a resumed one once stage
  // j+1 says what it holds (RESUME).
  if (!resume) to_next_->Attach(stream, to_next_->sent());
  return absl::OkStatus();
}

absl::Status StageStreams::Bind(const v1::StageMessage& open, const std::string& peer_identity,
                                std::shared_ptr<UpstreamStream> stream, MessageSink** sink) {
  // recovery.replay: a broken stream from stage j-1 is followed by one from
  // its replacement (or from it again, to a replacement of this stage).
  const bool resume = setup_.replay && open.resume();
  std::shared_ptr<UpstreamStream> old;
  {
    absl::MutexLock lock(&mu_);
    if (!prev_identity_.empty() && peer_identity != prev_identity_) {
      // Only the worker the coordinator put on stage j-1 may feed this stage.
      return absl::PermissionDeniedError(absl::StrCat(
          "certificate '", peer_identity.substr(0, 128), "' is not the one of stage ",
          setup_.stage - 1, " of job ", setup_.job_id, " (attempt ", setup_.attempt, ")"));
    }
    if (hooks_.stopped()) return absl::PermissionDeniedError("the job has stopped on this stage");
    if (upstream_ && !resume) {
      return absl::PermissionDeniedError(absl::StrCat(
          "stage ", setup_.stage, " of job ", setup_.job_id, " already has its upstream stream"));
    }
    old = std::exchange(upstream_, stream);
    std::unique_ptr<InboxSink> bound = MakeSink(true);
    bound->Bind(stream);
    *sink = bound.get();
    sinks_.push_back(std::move(bound));
  }
  if (old) old->Close(absl::AbortedError("stage j-1 opened a new stream"));
  if (resume) {
    // What this stage holds of stage j-1's messages; then each side resends
    // what the other does not hold.
    v1::StageMessage answer;
    answer.set_job_id(setup_.job_id);
    answer.set_kind(v1::StageMessage::RESUME);
    answer.set_attempt(setup_.attempt);
    answer.set_held_seq(to_prev_->held());
    (void)stream->TrySend(std::move(answer));  // the stream's first write: the outbox has room
    to_prev_->Attach(stream, open.held_seq());
    return absl::OkStatus();
  }
  to_prev_->Attach(stream, to_prev_->sent());
  // Same-host payloads: open stage j-1's ring, offer ours (made by
  // PrepareRing); a full outbox (never waited for here) leaves them off.
  if (open.has_ring()) {
    (void)stream->TrySend(RingMessage(setup_.job_id, setup_.attempt,
                                      prev_ring_.Offer(prev_ring_.Accept(open.ring()))));
  }
  return absl::OkStatus();
}

absl::Status StageStreams::Replaced(const v1::NeighbourReplaced& replaced) {
  if (!setup_.replay || replaced.attempt() != setup_.attempt) {
    return absl::FailedPreconditionError(absl::StrCat("NeighbourReplaced: stage ", setup_.stage,
                                                      " of job ", setup_.job_id, " (attempt ",
                                                      setup_.attempt, ") does not replay"));
  }
  if (!first() && replaced.stage() == setup_.stage - 1) {
    absl::MutexLock lock(&mu_);
    prev_identity_ = replaced.identity();  // it dials this stage
    return absl::OkStatus();
  }
  if (!last() && replaced.stage() == setup_.stage + 1) return Dial(replaced.address(), true);
  return absl::InvalidArgumentError(absl::StrCat("NeighbourReplaced.stage: ", replaced.stage(),
                                                 " is no neighbour of stage ", setup_.stage));
}

void StageStreams::Popped(bool from_prev, int64_t seq) {
  (from_prev ? popped_prev_ : popped_next_).store(seq, std::memory_order_relaxed);
  (from_prev ? prev_ring_ : next_ring_).Reap(seq);
}

void StageStreams::ReapRead() {
  prev_ring_.Reap(popped_prev_.load(std::memory_order_relaxed) + 1);
  next_ring_.Reap(popped_next_.load(std::memory_order_relaxed) + 1);
}

void StageStreams::Trim(int64_t step) {
  to_prev_->Trim(step);
  to_next_->Trim(step);
}

void StageStreams::Finish() {
  to_prev_->Flush();
  to_next_->Flush();
  std::shared_ptr<DownstreamStream> downstream;
  {
    absl::MutexLock lock(&mu_);
    downstream = downstream_;
  }
  if (downstream) {
    downstream->Close(absl::OkStatus());
    downstream->WaitDone();
  }
}

void StageStreams::Close(const absl::Status& why) {
  from_prev_.Close();
  from_next_.Close();
  if (prev_delay_) prev_delay_->Close();
  if (next_delay_) next_delay_->Close();
  to_next_->Close(why);
  to_prev_->Close(why);
}

}  // namespace stagewise::worker
