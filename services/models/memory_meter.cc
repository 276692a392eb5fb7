#include "services/models/memory_meter.h"

#include <c10/core/CPUAllocator.h>

#include <mutex>
#include <utility>

namespace stagewise::models {
namespace {

thread_local std::shared_ptr<MemoryAccount> current_account;

// What a charged allocation carries to its deleter.
struct Charge {
  c10::DataPtr inner;
  std::shared_ptr<MemoryAccount> account;
  int64_t bytes;
};

void Release(void* context) {
  auto* charge = static_cast<Charge*>(context);
  charge->account->Sub(charge->bytes);
  delete charge;  // frees the memory through the wrapped allocator's deleter
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base_->allocate(n);
    const std::shared_ptr<MemoryAccount>& account = current_account;
    if (!account || n == 0) return inner;
    void* data = inner.get();
    const c10::Device device = inner.device();
    account->Add(static_cast<int64_t>(n));
    auto* charge = new Charge{std::move(inner), account, static_cast<int64_t>(n)};
    return {data, charge, &Release, device};
  }

 private:
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
    // Leaked on purpose: tensors may outlive every static destructor.
    static auto* allocator = new CountingAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(allocator, /*priority=*/1);
  });
}

ScopedMemoryAccount::ScopedMemoryAccount(std::shared_ptr<MemoryAccount> account)
    : previous_(std::move(current_account)) {
  InstallMemoryMeter();
  current_account = std::move(account);
}

ScopedMemoryAccount::~ScopedMemoryAccount() { current_account = std::move(previous_); }

}  // namespace stagewise::models
