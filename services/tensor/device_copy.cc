#include "services/tensor/device_copy.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <map>
#include <mutex>

namespace stagewise {
namespace {

std::atomic<int64_t> to_host{0}, to_device{0};

c10::Device WithIndex(c10::Device device, const c10::impl::VirtualGuardImpl& impl) {
  return device.has_index() ? device : c10::Device(device.type(), impl.getDevice().index());
}

// One copy stream per device, from LibTorch's pool (created non-blocking:
// it does not wait for the legacy default stream, only for its events).
c10::Stream CopyStream(c10::Device device, const c10::impl::VirtualGuardImpl& impl) {
  static std::mutex mu;
  // By device index (every device here is of one type); leaked: used at exit.
  static auto* streams = new std::map<int, c10::Stream>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams->find(device.index());
  if (it == streams->end()) {
    it = streams
             ->emplace(device.index(),
                       impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false))
             .first;
  }
  return it->second;
}

}  // namespace

void CopyToHost(const torch::Tensor& src, void* dst) {
  const c10::impl::VirtualGuardImpl impl(src.device().type());
  const c10::Device device = WithIndex(src.device(), impl);
  const c10::Stream compute = impl.getStream(device);
  const c10::Stream copy = CopyStream(device, impl);
  // The copy starts once what is queued on the compute stream now (the
  // kernels that produced `src`) has run; `src` stays referenced by the
  // caller until the copy is done, so its memory cannot be reused meanwhile.
  c10::Event ready(device.type());
  ready.record(compute);
  ready.block(copy);
  {
    const c10::StreamGuard on_copy(copy);
    torch::from_blob(dst, src.sizes(), torch::TensorOptions().dtype(src.scalar_type()))
        .copy_(src, /*non_blocking=*/true);
  }
  copy.synchronize();
  to_host.fetch_add(1, std::memory_order_relaxed);
}

torch::Tensor CopyToDevice(const torch::Tensor& host, torch::Device device) {
  const c10::impl::VirtualGuardImpl impl(device.type());
  device = WithIndex(device, impl);
  const c10::Stream compute = impl.getStream(device);
  const c10::Stream copy = CopyStream(device, impl);
  torch::Tensor out;
  {
    const c10::StreamGuard on_copy(copy);
    out = torch::empty(host.sizes(), host.options().device(device));
    out.copy_(host, /*non_blocking=*/true);
  }
  copy.synchronize();  // `host` may be released (its ring region reused) now
  // Allocated for the copy stream: the allocator must not hand the block to
  // the next copy before the compute stream has finished with this tensor.
  impl.recordDataPtrOnStream(out.storage().data_ptr(), compute);
  to_device.fetch_add(1, std::memory_order_relaxed);
  return out;
}

DeviceCopyStats GetDeviceCopyStats() {
  DeviceCopyStats s;
  s.to_host = to_host.load(std::memory_order_relaxed);
  s.to_device = to_device.load(std::memory_order_relaxed);
  return s;
}

}  // namespace stagewise
