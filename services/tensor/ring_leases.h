// Payloads a receiving stage reads in place in its peer's shared ring.
//
// Copying a payload out of the ring costs a pass over it on the reader's
// thread, on the way from one stage's compute to the next. A large
// uncompressed floating-point payload (for a GPU receiver also an fp16/bf16
// one: ResolveOptions::lend_narrowed) can instead stay where it is
// (SharedRingView::Hold): ResolveSharedPayloads lends it to the message that
// carries it (TensorProto.shared.lease names the lease), and DecodeTensor takes
// the lease over, so the tensor reads the ring's pages and frees the region
// when it is freed itself. Only floating-point values are read in place: the
// peer can still write to its pages, which can change the numbers (as sending
// other numbers could) but never an index or a size, all of which are copied
// and checked.
//
// A lease no decoder took (a message dropped unread, one of its tensors never
// asked for) is returned by its owner: the stage returns the leases of older
// messages from a side when it receives the next one (Reap), and all of them
// when it stops, so the writer can always reuse the ring in the end. A message
// read after that fails loudly instead of reading freed pages.
#ifndef STAGEWISE_SERVICES_TENSOR_RING_LEASES_H_
#define STAGEWISE_SERVICES_TENSOR_RING_LEASES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "services/tensor/shared_ring.h"

namespace stagewise {

// One held payload; releases its region when destroyed. Move-only.
class RingLease {
 public:
  RingLease(std::shared_ptr<SharedRingView> view, uint64_t offset, uint64_t length, uint8_t* bytes)
      : view_(std::move(view)), offset_(offset), length_(length), bytes_(bytes) {}
  ~RingLease() {
    if (view_) view_->Release(offset_, length_);
  }
  RingLease(RingLease&& other) noexcept
      : view_(std::move(other.view_)),
        offset_(other.offset_),
        length_(other.length_),
        bytes_(other.bytes_) {}
  RingLease& operator=(RingLease&&) = delete;
  RingLease(const RingLease&) = delete;
  RingLease& operator=(const RingLease&) = delete;

  uint8_t* bytes() const { return bytes_; }
  uint64_t length() const { return length_; }

 private:
  std::shared_ptr<SharedRingView> view_;
  uint64_t offset_, length_;
  uint8_t* bytes_;
};

// The process's leases not yet taken, by id. Thread-safe.
class RingLeases {
 public:
  // Registers `lease`, of the message numbered `seq` that `owner` received;
  // its id (never 0), for TensorProto.shared.lease.
  static uint64_t Lend(const void* owner, int64_t seq, RingLease lease);
  // The lease of `id`, now the caller's; nullopt when there is none (never
  // lent, taken already, or returned by its owner).
  static std::optional<RingLease> Take(uint64_t id);
  // Calls `read` with the payload's bytes and leaves the lease where it is;
  // false when there is none.
  static bool Read(uint64_t id, const std::function<void(const uint8_t* bytes)>& read);
  // Returns (releases) `owner`'s leases of messages numbered below
  // `below_seq`; how many.
  static int Reap(const void* owner, int64_t below_seq);
  // Leases lent and not yet taken or returned (tests, diagnostics).
  static int64_t Outstanding();
  // Payloads lent in this process so far (tests, diagnostics).
  static int64_t TotalLent();
};

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_RING_LEASES_H_
