// Counts the bytes of live CPU tensors by who allocated them: the planner's
// profiler measures per-block memory with it and every stage reports its peak
// (docs/planner.md, "Profiler"). A counting allocator wraps LibTorch's
// default CPU allocator; while a thread holds a ScopedMemoryAccount, the CPU
// tensors it allocates are charged to that account until they are freed
// (whichever thread frees them). Allocations outside any scope pass through
// uncounted. CUDA memory is not counted here (the CUDA caching allocator has
// its own statistics).
#ifndef STAGEWISE_SERVICES_MODELS_MEMORY_METER_H_
#define STAGEWISE_SERVICES_MODELS_MEMORY_METER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

namespace stagewise::models {

class MemoryAccount {
 public:
  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  // Starts a new peak window at the current level.
  void ResetPeak() { peak_.store(current_.load()); }

  void Add(int64_t bytes);
  void Sub(int64_t bytes) { current_.fetch_sub(bytes); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

// Installs the counting allocator as LibTorch's CPU allocator (idempotent,
// thread-safe). Tensors allocated before it was installed are never counted.
void InstallMemoryMeter();

// While alive, CPU tensors allocated on this thread are charged to `account`
// (nested scopes restore the outer account). Installs the meter if needed.
// Charges `bytes` that the meter did not allocate (a buffer a tensor took
// over, e.g. a decoded message payload: DecodeOptions::charge) to this
// thread's account, if a scope is active; the returned function takes the
// charge back (call it once, from any thread).
std::function<void()> ChargeForeignBytes(int64_t bytes);

class ScopedMemoryAccount {
 public:
  explicit ScopedMemoryAccount(std::shared_ptr<MemoryAccount> account);
  ~ScopedMemoryAccount();
  ScopedMemoryAccount(const ScopedMemoryAccount&) = delete;
  ScopedMemoryAccount& operator=(const ScopedMemoryAccount&) = delete;

 private:
  std::shared_ptr<MemoryAccount> previous_;
};

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_MEMORY_METER_H_
