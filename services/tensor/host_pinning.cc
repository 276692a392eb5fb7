#include "services/tensor/host_pinning.h"

#include <dlfcn.h>

#include <atomic>

namespace stagewise {
namespace {

std::atomic<bool> enabled{false};
std::atomic<int64_t> pinned_ranges{0}, pin_failures{0};

// cudaHostRegister(ptr, size, flags) and cudaHostUnregister(ptr); both return
// cudaError_t, 0 on success.
using RegisterFn = int (*)(void*, size_t, unsigned int);
using UnregisterFn = int (*)(void*);
using LastErrorFn = int (*)();
constexpr unsigned int kHostRegisterPortable = 1;  // pinned for every context

struct Runtime {
  RegisterFn pin = nullptr;
  UnregisterFn unpin = nullptr;
  // cudaGetLastError: clears a failed call's error, which LibTorch would
  // otherwise find at its next kernel launch and report as that kernel's.
  LastErrorFn clear = nullptr;
};

const Runtime& CudaRuntime() {
  static const Runtime runtime = [] {
    Runtime r;
    void* handle = RTLD_DEFAULT;
    if (dlsym(handle, "cudaHostRegister") == nullptr) {
      // Loaded, but not into the global scope: find it by its name.
      handle = nullptr;
      for (const char* name :
           {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) {
        handle = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
        if (handle != nullptr) break;
      }
      if (handle == nullptr) return r;
    }
    r.pin = reinterpret_cast<RegisterFn>(dlsym(handle, "cudaHostRegister"));
    r.unpin = reinterpret_cast<UnregisterFn>(dlsym(handle, "cudaHostUnregister"));
    r.clear = reinterpret_cast<LastErrorFn>(dlsym(handle, "cudaGetLastError"));
    if (r.pin == nullptr || r.unpin == nullptr || r.clear == nullptr) r = Runtime{};
    return r;
  }();
  return runtime;
}

}  // namespace

void EnableDeviceCopies(bool on) { enabled.store(on, std::memory_order_release); }
bool DeviceCopiesEnabled() { return enabled.load(std::memory_order_acquire); }

bool HostPinningAvailable() { return CudaRuntime().pin != nullptr; }

bool PinHostRange(void* data, size_t bytes) {
  if (!DeviceCopiesEnabled() || data == nullptr || bytes == 0) return false;
  const Runtime& rt = CudaRuntime();
  if (rt.pin == nullptr) {
    pin_failures.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (rt.pin(data, bytes, kHostRegisterPortable) != 0) {
    (void)rt.clear();
    pin_failures.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  pinned_ranges.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void UnpinHostRange(void* data) {
  const Runtime& rt = CudaRuntime();
  if (rt.unpin != nullptr && data != nullptr && rt.unpin(data) != 0) (void)rt.clear();
}

HostPinningStats GetHostPinningStats() {
  HostPinningStats s;
  s.pinned_ranges = pinned_ranges.load(std::memory_order_relaxed);
  s.pin_failures = pin_failures.load(std::memory_order_relaxed);
  return s;
}

}  // namespace stagewise
