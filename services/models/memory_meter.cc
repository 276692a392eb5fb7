#include "services/models/memory_meter.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace stagewise::models {
namespace {

thread_local std::shared_ptr<MemoryAccount> current_account;

// Charged allocations by address. Some kernels (oneDNN) allocate through
// raw_allocate, which needs the context to be the data pointer itself, so the
// charge cannot ride in the DataPtr's context: it is looked up here on free.
struct Charge {
  std::shared_ptr<MemoryAccount> account;
  int64_t bytes;
};
constexpr size_t kShards = 16;
struct Shard {
  std::mutex mu;
  std::unordered_map<void*, Charge> charges;
};
Shard* Shards() {
  static auto* shards = new Shard[kShards];  // leaked: frees may come after exit
  return shards;
}
Shard& ShardOf(void* p) { return Shards()[(reinterpret_cast<uintptr_t>(p) >> 6) % kShards]; }

c10::DeleterFnPtr base_deleter = nullptr;

void CountingDelete(void* data) {
  if (data == nullptr) return;
  Shard& shard = ShardOf(data);
  std::optional<Charge> charge;
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.charges.find(data);
    if (it != shard.charges.end()) {
      charge = std::move(it->second);
      shard.charges.erase(it);
    }
  }
  if (charge) charge->account->Sub(charge->bytes);
  base_deleter(data);
}

// LibTorch changed c10::Allocator's interface after 1.13 (allocate() lost its
// const, copy_data() became pure virtual); this class declares both forms
// without `override`, so the one the base declares is the one that overrides
// and the other is an unused overload.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const { return Allocate(n); }  // LibTorch 1.x
  c10::DataPtr allocate(size_t n) { return Allocate(n); }        // LibTorch 2.x
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }

  c10::DeleterFnPtr raw_deleter() const { return &CountingDelete; }

 private:
  c10::DataPtr Allocate(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    // The base allocator's context is the data pointer and its deleter
    // the raw one; take ownership so that CountingDelete frees it.
    (void)inner.release_context();
    if (const std::shared_ptr<MemoryAccount>& account = current_account; account && data) {
      account->Add(static_cast<int64_t>(n));
      Shard& shard = ShardOf(data);
      std::lock_guard<std::mutex> lock(shard.mu);
      shard.charges[data] = Charge{account, static_cast<int64_t>(n)};
    }
    return {data, data, &CountingDelete, device};
  }

  c10::Allocator* base_;
};

}  // namespace

void MemoryAccount::Add(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  int64_t seen = peak_.load();
  while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
  }
}

void InstallMemoryMeter() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: tensors may outlive every static destructor. The
    // base is the allocator in place: LibTorch's own, or the host block cache
    // (services/tensor/host_blocks.h), whose context is its data pointer too.
    c10::Allocator* base = c10::GetCPUAllocator();
    base_deleter = base->raw_deleter();
    static auto* allocator = new CountingAllocator(base);
    c10::SetCPUAllocator(allocator, /*priority=*/1);
  });
}

std::function<void()> ChargeForeignBytes(int64_t bytes) {
  std::shared_ptr<MemoryAccount> account = current_account;
  if (!account || bytes <= 0) return [] {};
  account->Add(bytes);
  return [account, bytes] { account->Sub(bytes); };
}

ScopedMemoryAccount::ScopedMemoryAccount(std::shared_ptr<MemoryAccount> account)
    : previous_(std::move(current_account)) {
  InstallMemoryMeter();
  current_account = std::move(account);
}

ScopedMemoryAccount::~ScopedMemoryAccount() { current_account = std::move(previous_); }

}  // namespace stagewise::models
