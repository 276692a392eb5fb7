// Page-locking host memory for the GPUs, and the process's switch for the
// GPU side of the stage-to-stage path (device_copy.h says what it changes).
// Free of LibTorch: the shared rings pin themselves with it. The CUDA
// runtime's cudaHostRegister is looked up at run time in the process
// (LibTorch's CUDA build loads the runtime), so this compiles and links
// without CUDA, where pinning is simply unavailable.
#ifndef STAGEWISE_SERVICES_TENSOR_HOST_PINNING_H_
#define STAGEWISE_SERVICES_TENSOR_HOST_PINNING_H_

#include <cstddef>
#include <cstdint>

namespace stagewise {

// Process-wide switch (a worker on a CUDA device sets it at start, from
// --device-copies).
void EnableDeviceCopies(bool on);
bool DeviceCopiesEnabled();

// Whether the CUDA runtime's cudaHostRegister is loaded in this process.
bool HostPinningAvailable();

// Page-locks [data, data + bytes) for every GPU when device copies are on and
// the runtime is there; true when it did (the caller then calls
// UnpinHostRange before unmapping it).
bool PinHostRange(void* data, size_t bytes);
void UnpinHostRange(void* data);

struct HostPinningStats {
  int64_t pinned_ranges = 0;  // ranges page-locked so far
  int64_t pin_failures = 0;   // asked to pin (device copies on), and could not
};
HostPinningStats GetHostPinningStats();

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_HOST_PINNING_H_
