// transport's formats on the links: bytes per float32 byte, a stage's link
// time, and `compression: auto`'s choice (planner.h; docs/planner.md,
// "compression: auto").
#include <algorithm>

#include "services/planner/planner.h"

namespace stagewise::planner {

double WireBytesRatio(Compression compression, int block) {
  const double per_block = 1.0 / std::max(block, 1);
  switch (compression) {
    case Compression::kFp16:
    case Compression::kBf16:
      return 0.5;
    case Compression::kInt8:
      return 0.25 + per_block;
    case Compression::kInt4:
      return 0.125 + per_block;
    case Compression::kNone:
    case Compression::kAuto:
      break;
  }
  return 1;
}

double LinkSeconds(const StageSends& sends, const WireChoice& wire, const PlanOptions& o) {
  if (o.link_bytes_per_s <= 0) return 0;
  auto send = [&](int64_t bytes, Compression c, int block) {
    return o.link_latency_s +
           static_cast<double>(bytes) * WireBytesRatio(c, block) / o.link_bytes_per_s;
  };
  double s = 0;
  if (sends.forward_bytes > 0) s += send(sends.forward_bytes, wire.forward, o.forward_wire.block);
  if (sends.backward_bytes > 0) {
    s += sends.backward_tensors * send(sends.backward_bytes, wire.backward, o.backward_wire.block);
  }
  return s;
}

WireChoice ChooseWire(const StageSends& sends, double compute_s, const PlanOptions& o) {
  const Compression forward = o.forward_wire.compression;
  const Compression backward = o.backward_wire.compression;
  auto with = [&](Compression c) {
    return WireChoice{forward == Compression::kAuto ? c : forward,
                      backward == Compression::kAuto ? c : backward};
  };
  if (o.link_bytes_per_s <= 0) return with(Compression::kNone);
  // Only the bytes' time decides: a message's latency is paid whatever its
  // format, and overlaps the compute (a link of 25 ms each way does not make
  // int4 of a fast link).
  PlanOptions bytes_only = o;
  bytes_only.link_latency_s = 0;
  constexpr Compression kLightestFirst[] = {Compression::kNone, Compression::kBf16,
                                            Compression::kInt8, Compression::kInt4};
  for (Compression c : kLightestFirst) {
    if (LinkSeconds(sends, with(c), bytes_only) <= compute_s) return with(c);
  }
  return with(Compression::kInt4);
}

}  // namespace stagewise::planner
