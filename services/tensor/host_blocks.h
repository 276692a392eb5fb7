// Reuse of large host (CPU) tensor memory within a process
// (docs/performance.md, "Host memory reuse").
//
// LibTorch's CPU allocator hands each tensor fresh memory from malloc, and
// glibc serves a block of more than 32 MiB (less, until its threshold has
// grown) with its own mmap: every activation of a large micro-batch then
// costs a page fault and a zeroed page per 4 KiB when first written, and an
// munmap when freed. On a CPU stage that is a kernel pass over every
// activation, on the cores that also compute and move the messages. The host
// block cache, installed as LibTorch's CPU allocator, keeps freed blocks of
// at least `min_block_bytes` (up to `max_cached_bytes` of them, held free)
// and hands them to the next tensor of the same size class, as LibTorch's
// CUDA caching allocator does for device memory; smaller blocks go to malloc
// and back as before. Blocks are 64-byte aligned, as LibTorch's own.
#ifndef STAGEWISE_SERVICES_TENSOR_HOST_BLOCKS_H_
#define STAGEWISE_SERVICES_TENSOR_HOST_BLOCKS_H_

#include <cstddef>
#include <cstdint>

namespace stagewise {

struct HostBlockOptions {
  uint64_t min_block_bytes = uint64_t{1} << 20;   // smaller tensors are not kept
  uint64_t max_cached_bytes = uint64_t{1} << 30;  // free blocks held at most
};

// Makes the cache this process's CPU allocator (the first call, unless
// another than LibTorch's own was installed before; tensors allocated before
// keep their deleters, so they are freed correctly) and sets its limits
// (every call). max_cached_bytes 0: blocks are no longer kept (those held
// are freed).
void InstallHostBlockCache(const HostBlockOptions& options);

struct HostBlockStats {
  bool installed = false;     // the cache serves LibTorch's CPU tensors
  int64_t reused = 0;         // large allocations served from the cache
  int64_t fresh = 0;          // large allocations that went to malloc
  uint64_t cached_bytes = 0;  // held free now
};
HostBlockStats GetHostBlockStats();

// Placement (docs/performance.md, "Outputs made in the ring"): a thread can
// have its allocations of one exact size served by another arena first, so
// that a tensor it is about to compute (a stage's output for a neighbour on
// this host) is made where it will be read, with no copy afterwards. Only
// with the cache installed; elsewhere nothing is placed.
class HostArena {
 public:
  virtual ~HostArena() = default;
  // `bytes` bytes, 64-byte aligned, inside a range registered for this
  // arena, or null (the cache serves the allocation as usual).
  virtual void* Place(size_t bytes) = 0;
  // Frees what Place returned (any thread, once). The arena stays alive
  // while it has placed memory (the caller of Place sees to it).
  virtual void Unplace(void* data) = 0;
};
// The cache frees memory inside [begin, begin + size) through `arena`.
// False when 32 arenas are registered already (then do not Place).
bool RegisterHostArena(HostArena* arena, const void* begin, size_t size);
// Before the arena goes; it must have no placed memory left.
void UnregisterHostArena(HostArena* arena);

// While alive, this thread's allocations of exactly `bytes` bytes (through
// the cache) go to `arena` first; a null arena or 0 bytes: none. Nested:
// the inner one holds until it ends.
class ScopedHostPlacement {
 public:
  ScopedHostPlacement(HostArena* arena, size_t bytes);
  ~ScopedHostPlacement();
  ScopedHostPlacement(const ScopedHostPlacement&) = delete;
  ScopedHostPlacement& operator=(const ScopedHostPlacement&) = delete;

 private:
  HostArena* previous_arena_;
  size_t previous_bytes_;
};
// Allocations placed so far in this process (tests, diagnostics).
int64_t HostPlacedAllocations();

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_HOST_BLOCKS_H_
