// Same-host payloads between two neighbouring stages (docs/performance.md,
// "Neighbours on one host"): the sending stage writes a large tensor's bytes
// into a ring of shared memory it owns (or makes the tensor there in the
// first place: placement, below), and the gRPC stream carries only where they
// are (TensorProto.shared). The receiving stage maps the ring once, copies
// each payload out as its message arrives (so everything it checks is its own
// copy, which the writer can no longer change) or reads a large float one in
// place (ring_leases.h), and marks the region free; the writer reuses freed
// regions. No syscall, no socket copy, no HTTP/2 framing and no protobuf
// parse of the payload, and the ring's pages stay mapped.
//
// The ring is a file in a tmpfs directory (/dev/shm), created 0600 with a
// random name and a random token in its header; a peer that can open it and
// read the same token shares this host's memory (not just a hostname). The
// writer unlinks it when it goes; a reader's mapping stays valid until the
// reader drops it.
#ifndef STAGEWISE_SERVICES_TENSOR_SHARED_RING_H_
#define STAGEWISE_SERVICES_TENSOR_SHARED_RING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/tensor/host_blocks.h"

namespace stagewise {

// The writer's side. Allocate is thread-safe; regions are freed by the
// reader (SharedRingView::Take), in any order, and reused first-fit from
// the start of the ring.
//
// It is also a host arena (host_blocks.h): a tensor computed on a thread
// placing into this ring is made in a region of its own, which the writer
// holds until the tensor is freed; Publish then hands the reader that
// region as it is (docs/performance.md, "Outputs made in the ring"). A
// region is reused once its writer no longer holds it and its reader freed
// it (or it was never published). Placement needs the ring owned by a
// shared_ptr (it keeps itself alive while it has placed memory).
class SharedRing : public HostArena, public std::enable_shared_from_this<SharedRing> {
 public:
  static constexpr uint64_t kAlign = 64;  // region and payload alignment
  // A ring of `bytes` (rounded up to a page) in `dir`; FAILED_PRECONDITION
  // naming the directory when it cannot be created there.
  static absl::StatusOr<std::unique_ptr<SharedRing>> Create(const std::string& dir, uint64_t bytes);
  ~SharedRing() override;  // unmaps and unlinks the file
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  struct Region {
    uint64_t offset = 0;      // what TensorProto.shared.offset carries
    uint8_t* data = nullptr;  // `length` writable bytes, kAlign-aligned
    uint64_t length = 0;
  };
  // Room for `length` payload bytes now, or nullopt (the caller then sends
  // the bytes inline: a full ring never blocks a stage).
  std::optional<Region> Allocate(uint64_t length);

  // HostArena: a region for a tensor of `bytes` bytes (its payload) while
  // the ring, with it, is at most half in use (the rest stays for copies);
  // null otherwise.
  void* Place(size_t bytes) override;
  void Unplace(void* data) override;
  // As Place, for a tensor made to be sent at once (NarrowIntoRing): any
  // room, as Allocate. Unplace frees it.
  void* PlaceForSend(size_t bytes);
  // The offset (TensorProto.shared.offset) of the placed region whose
  // payload starts at `data` and is `length` bytes long, handed to the
  // reader now (once); nullopt when there is none (not placed here, another
  // length, published already).
  std::optional<uint64_t> Publish(const void* data, uint64_t length);
  // Whether `data` starts a placed region of `length` payload bytes that its
  // tensor still holds and that was not published.
  bool IsPlaced(const void* data, uint64_t length);
  // Whether `data` lies in this ring's payload area.
  bool Contains(const void* data) const;

  const std::string& name() const { return name_; }    // file name within dir
  const std::string& token() const { return token_; }  // 16 random bytes
  uint64_t size() const { return size_; }              // payload area
  // Bytes allocated and not yet reclaimed (after reclaiming what was freed).
  uint64_t used();
  // Payloads placed in any ring of this process so far (tests, diagnostics).
  static int64_t TotalPayloads();
  // Payloads that found their ring full (and went inline) so far.
  static int64_t TotalFull();
  // Placed tensors published as they were (no copy) so far.
  static int64_t TotalPublishedInPlace();

 private:
  SharedRing() = default;
  void ReclaimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeLocked(uint64_t offset, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A placed region while the ring, with it, has at most `limit` bytes in use.
  void* PlaceWithin(size_t bytes, uint64_t limit);
  // A region of `length` payload bytes (state kBusy, or kPlaced when
  // `placed`), or nullopt.
  std::optional<Region> AllocateLocked(uint64_t length, bool placed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string path_, name_, token_;
  uint8_t* base_ = nullptr;  // the whole mapping (header page + area)
  uint8_t* area_ = nullptr;
  uint64_t mapped_ = 0, size_ = 0;
  bool pinned_ = false;  // page-locked for the GPUs (device_copy.h)
  absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  // Regions not yet reclaimed, by offset. Only this side's lists say where
  // regions are; of the shared pages only the state word is read.
  struct Outstanding {
    uint64_t bytes;    // the region's, header included
    uint64_t length;   // the payload's
    bool placed;       // made by Place
    bool writer_held;  // placed and its tensor not yet freed
    bool published;    // handed to the reader (Allocate's always are)
  };
  std::map<uint64_t, Outstanding> regions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes, coalesced
  uint64_t placed_bytes_ ABSL_GUARDED_BY(mu_) = 0;          // regions writer_held
  bool registered_ ABSL_GUARDED_BY(mu_) = false;            // as a host arena
  std::shared_ptr<SharedRing> keep_ ABSL_GUARDED_BY(mu_);   // while placed_bytes_ > 0
};

// The reader's side: the peer's ring, mapped once. Thread-safe. Made only
// by Open, as a shared_ptr (a held payload keeps its view mapped).
class SharedRingView : public std::enable_shared_from_this<SharedRingView> {
 public:
  // Opens `name` in `dir` (a bare file name of letters, digits and '-'),
  // checks its size and token: NOT_FOUND / FAILED_PRECONDITION when it is
  // not the ring the peer described (e.g. another host's).
  static absl::StatusOr<std::shared_ptr<SharedRingView>> Open(const std::string& dir,
                                                              const std::string& name,
                                                              uint64_t size,
                                                              const std::string& token);
  ~SharedRingView();
  SharedRingView(const SharedRingView&) = delete;
  SharedRingView& operator=(const SharedRingView&) = delete;

  // Copies the payload at `offset` of `length` bytes into `out` and frees its
  // region. INVALID_ARGUMENT naming the field when the descriptor does not
  // point at a live region of that length (out of bounds, misaligned, taken
  // twice).
  absl::Status Take(uint64_t offset, uint64_t length, std::string* out);
  // As Take, but hands the payload's bytes to `read` (which copies what it
  // needs and keeps no pointer) before freeing the region.
  absl::Status TakeWith(uint64_t offset, uint64_t length,
                        const std::function<void(const uint8_t* bytes)>& read);
  // Checks the payload as Take does and leaves it in place: the region stays
  // this reader's (the writer cannot reuse it, a second Take or Hold of it
  // fails) until Release. Its bytes, valid until then.
  absl::StatusOr<uint8_t*> Hold(uint64_t offset, uint64_t length);
  // Frees a region Hold returned (once).
  void Release(uint64_t offset, uint64_t length);
  // Payload bytes held and not yet released.
  uint64_t held_bytes() const { return held_.load(std::memory_order_relaxed); }
  uint64_t size() const { return size_; }  // payload area

 private:
  SharedRingView() = default;
  // The payload's bytes when the descriptor points at a live region of that
  // length (kBusy), else INVALID_ARGUMENT.
  absl::StatusOr<uint8_t*> Check(uint64_t offset, uint64_t length);
  uint8_t* base_ = nullptr;
  uint8_t* area_ = nullptr;
  uint64_t mapped_ = 0, size_ = 0;
  bool pinned_ = false;  // page-locked for the GPUs (device_copy.h)
  std::atomic<uint64_t> held_{0};
};

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_SHARED_RING_H_
