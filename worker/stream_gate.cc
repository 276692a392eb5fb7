#include "worker/stream_gate.h"

#include <algorithm>

namespace stagewise::worker {

StreamGate::StreamGate(Options options) : options_(options) {}

StreamGate::Admitted StreamGate::Admit(const std::string& peer, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Admitted out;
  while (static_cast<int>(pending_.size()) >= std::max(1, options_.max_pending)) {
    const uint64_t victim = VictimLocked();
    RemoveLocked(victim);
    out.evict.push_back(victim);
    ++evicted_;
  }
  out.ticket = next_ticket_++;
  pending_[out.ticket] = Pending{peer, now + options_.first_message_timeout};
  ++per_peer_[peer];
  return out;
}

uint64_t StreamGate::VictimLocked() const {
  // The peer with the most pending streams (ties: the one whose oldest
  // stream is oldest), and its oldest stream. A peer that binds its streams
  // at once never holds more than a stream or two.
  int most = 0;
  for (const auto& [peer, n] : per_peer_) most = std::max(most, n);
  for (const auto& [ticket, p] : pending_) {
    if (per_peer_.at(p.peer) == most) return ticket;
  }
  return pending_.begin()->first;
}

void StreamGate::RemoveLocked(uint64_t ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return;
  auto peer = per_peer_.find(it->second.peer);
  if (peer != per_peer_.end() && --peer->second <= 0) per_peer_.erase(peer);
  pending_.erase(it);
}

void StreamGate::Settle(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  RemoveLocked(ticket);
}

std::vector<uint64_t> StreamGate::TakeExpired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out;
  for (const auto& [ticket, p] : pending_) {
    if (p.deadline <= now) out.push_back(ticket);
  }
  for (uint64_t ticket : out) RemoveLocked(ticket);
  expired_ += static_cast<int64_t>(out.size());
  return out;
}

absl::Time StreamGate::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [ticket, p] : pending_) next = std::min(next, p.deadline);
  return next;
}

bool StreamGate::IsPending(uint64_t ticket) const {
  absl::MutexLock lock(&mu_);
  return pending_.count(ticket) > 0;
}

int StreamGate::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pending_.size());
}

int64_t StreamGate::evicted() const {
  absl::MutexLock lock(&mu_);
  return evicted_;
}

int64_t StreamGate::expired() const {
  absl::MutexLock lock(&mu_);
  return expired_;
}

}  // namespace stagewise::worker
