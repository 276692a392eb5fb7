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
  // Only an output that goes as it is: a narrowed one is made anew.
  if (wire.ring == nullptr || wire.compression != v1::COMPRESSION_NONE || bytes == 0) return;
  scope_.emplace(wire.ring, static_cast<size_t>(bytes));
}

void OutputPlacement::Received(Side from) { Aim(from == Side::kPrev); }

torch::Tensor OutputPlacement::Prepare(Side to, const torch::Tensor& tensor) {
  const bool to_next = to == Side::kNext;
  EncodeOptions wire = wire_(to_next);
  torch::Tensor rounded = NarrowIntoRing(tensor, &wire);
  if (wire.compression == v1::COMPRESSION_NONE && rounded.defined() && !rounded.is_same(tensor)) {
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
    const bool rounded =
        std::any_of(prepared.begin(), prepared.end(), [&x](const torch::Tensor& p) {
          return p.data_ptr() == x.data_ptr() && p.numel() == x.numel();
        });
    if (rounded && t.wire.residual == nullptr) {
      t.wire.compression = v1::COMPRESSION_NONE;  // rounded in the ring already: as it is
      continue;
    }
    const auto bytes = static_cast<uint64_t>(x.numel()) * sizeof(float);
    if (t.wire.compression == v1::COMPRESSION_NONE &&
        static_cast<int64_t>(bytes) >= t.wire.min_shared_bytes) {
      bytes_[to_next ? 1 : 0] = bytes;
    }
    t.tensor = NarrowIntoRing(x, &t.wire);
  }
  Aim(to_next);
}

}  // namespace stagewise::worker
