#include "worker/stage_service.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/rpc/status.h"
#include "services/rpc/tls.h"
#include "worker/stream_gate.h"

namespace stagewise::worker {

namespace {

// An Exchange call refused before it starts: finishes with `status` at once.
class RefusedExchange : public grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage> {
 public:
  explicit RefusedExchange(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7": a plaintext peer is its host.
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace

struct WorkerStageService::Pending {
  explicit Pending(StreamGate::Options options) : gate(options) {}
  // The gate's answer for `ticket` is final: the stream may not bind any
  // more, and is closed (now if registered, else when it is).
  std::weak_ptr<PeerStream> DoomLocked(uint64_t ticket, const char* reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    doomed[ticket] = reason;
    std::weak_ptr<PeerStream> stream;
    auto it = streams.find(ticket);
    if (it != streams.end()) {
      stream = std::move(it->second);
      streams.erase(it);
    }
    return stream;
  }
  void Forget(uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    gate.Settle(ticket);
    streams.erase(ticket);
    doomed.erase(ticket);
  }
  bool ShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return wake || stopping; }

  absl::Mutex mu;
  StreamGate gate;  // used under mu (its own lock nests inside)
  std::map<uint64_t, std::weak_ptr<PeerStream>> streams ABSL_GUARDED_BY(mu);
  std::map<uint64_t, const char*> doomed ABSL_GUARDED_BY(mu);  // ticket -> reason
  bool wake ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
};

WorkerStageService::WorkerStageService(StageServiceOptions options, prometheus::Registry& registry)
    : options_(std::move(options)),
      open_(std::make_shared<std::atomic<int>>(0)),
      pending_(std::make_shared<Pending>(
          StreamGate::Options{options_.max_pending_streams, options_.first_message_timeout})),
      refused_(prometheus::BuildCounter()
                   .Name("stagewise_worker_streams_refused_total")
                   .Help("Exchange streams the worker refused or closed before they carried a "
                         "stage's traffic, by reason (too_many, evicted, no_first_message, "
                         "not_a_worker, not_assigned).")
                   .Register(registry)),
      reaper_([this] { Reap(); }) {}

WorkerStageService::~WorkerStageService() {
  {
    absl::MutexLock lock(&pending_->mu);
    pending_->stopping = true;
  }
  reaper_.join();
}

grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* WorkerStageService::Exchange(
    grpc::CallbackServerContext* ctx) {
  const std::string identity = rpc::PeerIdentity(*ctx->auth_context());
  if (options_.require_worker_identity && !rpc::IsWorkerIdentity(identity)) {
    // Only workers feed stages: a client's or dashboard's certificate is
    // refused before it takes any slot.
    refused_.Add({{"reason", "not_a_worker"}}).Increment();
    return new RefusedExchange(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("certificate '", identity.substr(0, 128),
                     "' is not a worker's (worker certificates have the Common Name worker, "
                     "worker-* or worker.*)")));
  }
  // A slot per open stream, given back when the stream is destroyed.
  if (open_->fetch_add(1) >= options_.max_streams) {
    open_->fetch_sub(1);
    refused_.Add({{"reason", "too_many"}}).Increment();
    return new RefusedExchange(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat("this worker already has ", options_.max_streams,
                                  " stage streams open (--max-streams)")));
  }
  std::string peer = identity.empty() ? PeerHost(ctx->peer()) : identity;
  Pending& p = *pending_;
  uint64_t ticket = 0;
  std::vector<std::weak_ptr<PeerStream>> victims;
  {
    absl::MutexLock lock(&p.mu);
    const StreamGate::Admitted admitted = p.gate.Admit(peer, absl::Now());
    ticket = admitted.ticket;
    for (uint64_t victim : admitted.evict) victims.push_back(p.DoomLocked(victim, "evicted"));
    p.wake = true;  // the reaper's next deadline may be this one
  }
  // Given back when the stream is destroyed (which may be after the service).
  std::shared_ptr<void> slot(nullptr, [open = open_, pending = pending_, ticket](void*) {
    open->fetch_sub(1);
    absl::MutexLock lock(&pending->mu);
    pending->Forget(ticket);
  });
  UpstreamStream* stream = UpstreamStream::Start(
      [this, slot, ticket, identity](const v1::StageMessage& first,
                                     std::shared_ptr<UpstreamStream> s,
                                     MessageSink** sink) -> absl::Status {
        {
          absl::MutexLock lock(&pending_->mu);
          if (pending_->doomed.count(ticket)) {
            return absl::ResourceExhaustedError("this stream was closed before its first message");
          }
          pending_->Forget(ticket);  // bound (or refused below): no longer pending
        }
        absl::Status routed = options_.route(first, identity, std::move(s), sink);
        if (absl::IsPermissionDenied(routed)) {
          refused_.Add({{"reason", "not_assigned"}}).Increment();
        }
        return routed;
      },
      /*outbox_capacity=*/16);
  const char* doomed = nullptr;
  {
    absl::MutexLock lock(&p.mu);
    auto it = p.doomed.find(ticket);
    if (it != p.doomed.end()) {
      doomed = it->second;  // evicted or expired before it was registered here
    } else if (p.gate.IsPending(ticket)) {
      p.streams[ticket] = stream->weak_from_this();
    }
  }
  if (doomed != nullptr) CloseStream(stream->weak_from_this(), doomed);
  for (std::weak_ptr<PeerStream>& victim : victims) CloseStream(std::move(victim), "evicted");
  return stream;
}

grpc::ServerUnaryReactor* WorkerStageService::CopyReplica(grpc::CallbackServerContext* ctx,
                                                          const v1::CopyReplicaRequest* request,
                                                          v1::CopyReplicaResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const std::string identity = rpc::PeerIdentity(*ctx->auth_context());
  if (options_.require_worker_identity && !rpc::IsWorkerIdentity(identity)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "CopyReplica: only workers copy a replica's state"));
  } else {
    reactor->Finish(rpc::ToGrpcStatus(options_.copy_replica(*request, response)));
  }
  return reactor;
}

void WorkerStageService::CloseStream(std::weak_ptr<PeerStream> weak, const char* reason) {
  std::shared_ptr<PeerStream> stream = weak.lock();
  if (stream == nullptr || stream->done()) return;  // the peer hung up meanwhile
  refused_.Add({{"reason", reason}}).Increment();
  if (std::string(reason) == "evicted") {
    stream->Close(absl::ResourceExhaustedError(
        "closed before its first message: this worker has too many Exchange streams without "
        "one (--max-pending-streams), and this one was the oldest of the busiest peer"));
  } else {
    stream->Close(absl::DeadlineExceededError(absl::StrCat(
        "no StageMessage within ", absl::FormatDuration(options_.first_message_timeout),
        " of opening the stream (--stream-first-message-timeout)")));
  }
}

void WorkerStageService::Reap() {
  Pending& p = *pending_;
  for (;;) {
    std::vector<std::weak_ptr<PeerStream>> expired;
    {
      absl::MutexLock lock(&p.mu);
      p.mu.AwaitWithDeadline(absl::Condition(&p, &Pending::ShouldWake), p.gate.NextDeadline());
      if (p.stopping) return;
      p.wake = false;
      for (uint64_t ticket : p.gate.TakeExpired(absl::Now())) {
        expired.push_back(p.DoomLocked(ticket, "no_first_message"));
      }
    }
    for (std::weak_ptr<PeerStream>& stream : expired) {
      CloseStream(std::move(stream), "no_first_message");
    }
  }
}

}  // namespace stagewise::worker
