#include "worker/same_host.h"

#include <limits>

#include "services/common/log.h"
#include "services/tensor/ring_leases.h"
#include "services/tensor/stage_message.h"

namespace stagewise::worker {

v1::SharedRingOffer SameHostLink::Offer(bool opened_peer) {
  v1::SharedRingOffer offer;
  offer.set_opened_peer(opened_peer);
  absl::MutexLock lock(&mu_);
  if (!tried_ && !dir_.empty()) {
    tried_ = true;
    auto ring = SharedRing::Create(dir_, ring_bytes_);
    if (ring.ok()) {
      ring_ = std::move(*ring);
    } else {
      STAGEWISE_LOG(WARNING) << "same-host payloads off for this stream: "
                             << ring.status().message();
    }
  }
  if (ring_ != nullptr) {
    offer.set_name(ring_->name());
    offer.set_size(ring_->size());
    offer.set_token(ring_->token());
  }
  return offer;
}

void SameHostLink::PeerAnswered(bool opened) {
  absl::MutexLock lock(&mu_);
  if (answered_) return;  // a second answer could free a ring in use
  answered_ = true;
  if (opened) {
    peer_opened_.store(ring_ != nullptr, std::memory_order_release);
  } else {
    ring_.reset();  // never used: peer_opened_ stays false
  }
}

bool SameHostLink::Accept(const v1::SharedRingOffer& peer) {
  absl::MutexLock lock(&mu_);
  if (accepted_) return view_ != nullptr;
  accepted_ = true;
  if (dir_.empty() || peer.name().empty()) return false;
  auto view = SharedRingView::Open(dir_, peer.name(), peer.size(), peer.token());
  if (!view.ok()) {
    // Expected across hosts: the peer's ring is not in this host's memory.
    STAGEWISE_LOG(DEBUG) << "the peer's shared ring is not reachable: " << view.status().message();
    return false;
  }
  view_ = std::move(*view);
  return true;
}

absl::Status SameHostLink::Resolve(v1::StageMessage* message) {
  bool shared = false;
  for (const auto& [name, tensor] : message->tensors()) shared = shared || tensor.has_shared();
  if (!shared) return absl::OkStatus();
  std::shared_ptr<SharedRingView> view;
  {
    absl::MutexLock lock(&mu_);
    view = view_;
  }
  ResolveOptions options;
  options.widen = widen_;
  options.lend_owner = this;
  options.lend_narrowed = !widen_;  // a GPU stage copies them up as they came
  return ResolveSharedPayloads(message, view.get(), options);
}

void SameHostLink::Reap(int64_t below_seq) { RingLeases::Reap(this, below_seq); }

SameHostLink::~SameHostLink() { Reap(std::numeric_limits<int64_t>::max()); }

v1::StageMessage RingMessage(const std::string& job_id, int attempt, v1::SharedRingOffer offer) {
  v1::StageMessage m;
  m.set_job_id(job_id);
  m.set_kind(v1::StageMessage::RING);
  m.set_attempt(attempt);
  *m.mutable_ring() = std::move(offer);
  return m;
}

}  // namespace stagewise::worker
