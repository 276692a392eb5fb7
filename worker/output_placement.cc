#include "worker/output_placement.h"

#include <algorithm>
#include <utility>

namespace stagewise::worker {

void OutputPlacement::Aim(bool to_next) {
  if (first_) to_next = true;
  if (last_) to_next = false;
  scope_.reset();
  if (first_ && last_) return;  // one stage: no neighbour
  const EncodeOptions wire = wire_(to_next);
  const uint64_t bytes = bytes_[to_next ? 1 : 0];
  if (wire.ring == nullptr || bytes == 0 || !InPlace(wire, to_next)) return;
  scope_.emplace(wire.ring, static_cast<size_t>(bytes));
}

bool OutputPlacement::InPlace(const EncodeOptions& wire, bool to_next) {
  if (wire.compression == v1::COMPRESSION_NONE) return true;
  // A gradient is not read again once sent: rounded where it was made.
  // An output is (its backward), so a narrowed one is made anew.
  const bool narrow =
      wire.compression == v1::COMPRESSION_FP16 || wire.compression == v1::COMPRESSION_BF16;
  return !to_next && narrow && wire.round_in_ring && wire.residual == nullptr;
}

void OutputPlacement::Received(Side from) { Aim(from == Side::kPrev); }

torch::Tensor OutputPlacement::Prepare(Side to, const torch::Tensor& tensor) {
  const bool to_next = to == Side::kNext;
  EncodeOptions wire = wire_(to_next);
  const v1::Compression asked = wire.compression;
  torch::Tensor rounded = NarrowIntoRing(tensor, &wire, /*given_up=*/!to_next);
  if (asked != v1::COMPRESSION_NONE && wire.compression == v1::COMPRESSION_NONE) {
    prepared_[to_next ? 1 : 0].push_back(rounded);
  }
  return rounded;
}

void OutputPlacement::Sending(Side to, std::vector<OutgoingTensor>* tensors) {
  const bool to_next = to == Side::kNext;
  const std::vector<torch::Tensor> prepared = std::move(prepared_[to_next ? 1 : 0]);
  prepared_[to_next ? 1 : 0].clear();
  for (OutgoingTensor& t : *tensors) {
    const torch::Tensor& x = t.tensor;
    if (t.wire.ring == nullptr || !x.defined() || !x.is_cpu() || x.scalar_type() != torch::kFloat) {
      continue;
    }
    const auto bytes = static_cast<uint64_t>(x.numel()) * sizeof(float);
    if (InPlace(t.wire, to_next) && static_cast<int64_t>(bytes) >= t.wire.min_shared_bytes) {
      bytes_[to_next ? 1 : 0] = bytes;
    }
    const bool rounded =
        std::any_of(prepared.begin(), prepared.end(), [&x](const torch::Tensor& p) {
          return p.data_ptr() == x.data_ptr() && p.numel() == x.numel();
        });
    if (rounded && t.wire.residual == nullptr) {
      t.wire.compression = v1::COMPRESSION_NONE;  // rounded in the ring already: as it is
      continue;
    }
    t.tensor = NarrowIntoRing(x, &t.wire);
  }
  Aim(to_next);
}

}  // namespace stagewise::worker
