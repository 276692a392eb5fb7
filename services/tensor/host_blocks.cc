#include "services/tensor/host_blocks.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace stagewise {
namespace {

constexpr size_t kAlign = 64;               // LibTorch's CPU alignment
constexpr size_t kHeader = kAlign;          // the block's size, in front of its data
constexpr size_t kClass = size_t{1} << 16;  // large sizes round up to 64 KiB

struct Header {
  uint64_t bytes;  // the whole block, header included
};

// Arenas that placed memory may come from: a fixed table read without a
// lock by every free (only while one is registered), written under arena_mu.
constexpr int kMaxArenas = 32;
struct ArenaSlot {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<HostArena*> arena{nullptr};
};
ArenaSlot arenas[kMaxArenas];
std::atomic<int> arena_count{0};
absl::Mutex arena_mu;
std::atomic<int64_t> placed_total{0};

thread_local HostArena* placement_arena = nullptr;
thread_local size_t placement_bytes = 0;

// The arena `data` was placed by, or null.
HostArena* ArenaOf(void* data) {
  if (arena_count.load(std::memory_order_acquire) == 0) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(data);
  for (ArenaSlot& slot : arenas) {
    if (at >= slot.begin.load(std::memory_order_acquire) &&
        at < slot.end.load(std::memory_order_acquire)) {
      return slot.arena.load(std::memory_order_acquire);
    }
  }
  return nullptr;
}

// The allocator. Every block carries a header with its size, so that the
// deleter (one function, as LibTorch's raw interface needs) knows whether to
// keep it; data = block + kHeader.
class HostBlockCache final : public c10::Allocator {
 public:
  // LibTorch declared allocate const up to 1.13 and non-const later: both
  // are defined, and the one it declares is overridden.
  c10::DataPtr allocate(size_t n) const { return Allocate(n); }
  c10::DataPtr allocate(size_t n) { return Allocate(n); }
  c10::DeleterFnPtr raw_deleter() const { return &Delete; }
  // Pure virtual in later LibTorch (a plain copy for CPU memory); unused in 1.13.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }

  void Configure(const HostBlockOptions& options) {
    absl::MutexLock lock(&mu_);
    min_block_bytes_.store(options.min_block_bytes);
    max_cached_bytes_ = options.max_cached_bytes;
    Trim();
  }

  HostBlockStats Stats() {
    absl::MutexLock lock(&mu_);
    HostBlockStats s;
    s.installed = true;
    s.reused = reused_;
    s.fresh = fresh_;
    s.cached_bytes = cached_bytes_;
    return s;
  }

  static HostBlockCache& Get() {
    // Never destroyed: tensors may be freed after main returns.
    static HostBlockCache* cache = new HostBlockCache();
    return *cache;
  }

 private:
  c10::DataPtr Allocate(size_t n) const {
    return const_cast<HostBlockCache*>(this)->AllocateBlock(n);
  }

  c10::DataPtr AllocateBlock(size_t n) {
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &Delete, c10::Device(c10::DeviceType::CPU));
    if (n == placement_bytes && placement_arena != nullptr) {
      if (void* placed = placement_arena->Place(n)) {
        placed_total.fetch_add(1, std::memory_order_relaxed);
        return c10::DataPtr(placed, placed, &Delete, c10::Device(c10::DeviceType::CPU));
      }
    }
    size_t bytes = n + kHeader;
    void* block = nullptr;
    if (n >= min_block_bytes_.load(std::memory_order_relaxed)) {
      bytes = (bytes + kClass - 1) / kClass * kClass;
      absl::MutexLock lock(&mu_);
      // The smallest free block of at least this size, if it wastes at most
      // an eighth.
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= bytes + bytes / 8) {
        block = it->second;
        bytes = it->first;
        cached_bytes_ -= bytes;
        free_.erase(it);
        ++reused_;
      } else {
        ++fresh_;
      }
    }
    if (block == nullptr && posix_memalign(&block, kAlign, bytes) != 0) {
      throw std::bad_alloc();  // LibTorch reports it as out of memory
    }
    auto* header = static_cast<Header*>(block);
    header->bytes = bytes;
    void* data = static_cast<char*>(block) + kHeader;
    return c10::DataPtr(data, data, &Delete, c10::Device(c10::DeviceType::CPU));
  }

  static void Delete(void* data) {
    if (data == nullptr) return;
    if (HostArena* arena = ArenaOf(data)) {
      arena->Unplace(data);
      return;
    }
    void* block = static_cast<char*>(data) - kHeader;
    Get().Release(block);
  }

  void Release(void* block) {
    const uint64_t bytes = static_cast<Header*>(block)->bytes;
    if (bytes - kHeader >= min_block_bytes_.load(std::memory_order_relaxed)) {
      absl::MutexLock lock(&mu_);
      if (cached_bytes_ + bytes <= max_cached_bytes_) {
        free_.emplace(bytes, block);
        cached_bytes_ += bytes;
        return;
      }
    }
    std::free(block);
  }

  // Frees held blocks, largest first, until within the limit.
  void Trim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (cached_bytes_ > max_cached_bytes_ && !free_.empty()) {
      auto last = std::prev(free_.end());
      cached_bytes_ -= last->first;
      std::free(last->second);
      free_.erase(last);
    }
  }

  std::atomic<uint64_t> min_block_bytes_{UINT64_MAX};  // read without the lock
  absl::Mutex mu_;
  uint64_t max_cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::multimap<uint64_t, void*> free_ ABSL_GUARDED_BY(mu_);  // size -> block
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fresh_ ABSL_GUARDED_BY(mu_) = 0;
};

std::once_flag installed;
std::atomic<bool> is_installed{false};

}  // namespace

void InstallHostBlockCache(const HostBlockOptions& options) {
  HostBlockCache& cache = HostBlockCache::Get();
  cache.Configure(options);
  std::call_once(installed, [&cache] {
    // Only in place of LibTorch's own: an allocator installed before (the
    // memory meter, services/models/memory_meter.h) stays, and tensors keep
    // coming from malloc. The meter installed after wraps this one.
    if (c10::GetCPUAllocator() != c10::GetDefaultCPUAllocator()) return;
    // Above the default's priority (0): a later registration of LibTorch's
    // own allocator does not replace it.
    c10::SetCPUAllocator(&cache, /*priority=*/1);
    is_installed.store(true);
  });
}

bool RegisterHostArena(HostArena* arena, const void* begin, size_t size) {
  absl::MutexLock lock(&arena_mu);
  for (ArenaSlot& slot : arenas) {
    if (slot.arena.load() != nullptr) continue;
    // The range last: a free sees it only with its arena set.
    slot.arena.store(arena, std::memory_order_release);
    slot.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    slot.end.store(reinterpret_cast<uintptr_t>(begin) + size, std::memory_order_release);
    arena_count.fetch_add(1, std::memory_order_acq_rel);
    return true;
  }
  return false;
}

void UnregisterHostArena(HostArena* arena) {
  absl::MutexLock lock(&arena_mu);
  for (ArenaSlot& slot : arenas) {
    if (slot.arena.load() != arena) continue;
    slot.begin.store(0, std::memory_order_release);
    slot.end.store(0, std::memory_order_release);
    slot.arena.store(nullptr, std::memory_order_release);
    arena_count.fetch_sub(1, std::memory_order_acq_rel);
  }
}

ScopedHostPlacement::ScopedHostPlacement(HostArena* arena, size_t bytes)
    : previous_arena_(placement_arena), previous_bytes_(placement_bytes) {
  placement_arena = bytes > 0 ? arena : nullptr;
  placement_bytes = arena != nullptr ? bytes : 0;
}

ScopedHostPlacement::~ScopedHostPlacement() {
  placement_arena = previous_arena_;
  placement_bytes = previous_bytes_;
}

int64_t HostPlacedAllocations() { return placed_total.load(std::memory_order_relaxed); }

HostBlockStats GetHostBlockStats() {
  if (!is_installed.load()) return HostBlockStats{};  // never installed, or refused
  return HostBlockCache::Get().Stats();
}

}  // namespace stagewise
