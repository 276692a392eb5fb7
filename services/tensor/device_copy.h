// Copies between a stage's GPU and host memory on the stage-to-stage path
// (docs/cuda.md, "The device side of a message").
//
// LibTorch's own `tensor.to(device)` copies on the thread's current stream:
// a device-to-host copy waits for every kernel queued before it and then for
// a staged, pageable transfer, and a host-to-device copy waits behind the
// compute queue too. With device copies on (a worker on a CUDA device,
// `--device-copies stream`, the default there):
//  - the shared rings between neighbours on one host are pinned
//    (page-locked) where the CUDA runtime is loaded, so the copy engine reads
//    and writes them directly at full bus speed;
//  - a send copies its (already narrowed) tensor into the ring on a copy
//    stream of its own, after an event that marks what was queued on the
//    compute stream when the send began, so the compute thread never waits
//    for it;
//  - a receive copies the payload up on the same copy stream and hands the
//    compute stream a tensor it may use at once; the CUDA allocator is told
//    that the compute stream uses it, so its memory is not reused before the
//    compute stream is done with it.
// Everything here uses LibTorch's device-generic interfaces (c10::Stream,
// c10::Event), so it compiles against a CPU LibTorch too, where it is never
// switched on (host_pinning.h: the switch and the page-locking).
#ifndef STAGEWISE_SERVICES_TENSOR_DEVICE_COPY_H_
#define STAGEWISE_SERVICES_TENSOR_DEVICE_COPY_H_

#include <torch/types.h>

#include <cstdint>

#include "services/tensor/host_pinning.h"

namespace stagewise {

// Copies `src` (on a CUDA device) into `dst`, host memory of src.nbytes()
// bytes laid out contiguously in src's dtype, on the device's copy stream,
// after the work queued on the calling thread's current stream; returns when
// the bytes are there.
void CopyToHost(const torch::Tensor& src, void* dst);

// `host` (a CPU tensor) copied onto `device` (CUDA) on its copy stream; the
// result may be used on the calling thread's current stream at once.
torch::Tensor CopyToDevice(const torch::Tensor& host, torch::Device device);

struct DeviceCopyStats {
  int64_t to_host = 0;    // CopyToHost calls
  int64_t to_device = 0;  // CopyToDevice calls
};
DeviceCopyStats GetDeviceCopyStats();

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_DEVICE_COPY_H_
