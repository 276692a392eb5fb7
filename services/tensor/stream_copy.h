// Writing a payload into a shared ring (shared_ring.h) for another process
// to read: with non-temporal stores where the processor has them (AVX2), the
// bytes go to memory without first reading the destination's old contents
// into this core's cache (a plain copy's read-for-ownership) and without
// evicting this stage's working set. A third less time than memcpy for 4 MiB
// on the development machine (docs/performance.md, "Where a 1F1B hop goes").
// Plain loops below 256 KiB, to a destination not 32-byte aligned (ring
// regions are 64-byte aligned) and where AVX2 is missing.
#ifndef STAGEWISE_SERVICES_TENSOR_STREAM_COPY_H_
#define STAGEWISE_SERVICES_TENSOR_STREAM_COPY_H_

#include <cstddef>
#include <cstdint>

namespace stagewise {

// Copies `bytes` from `src` to `dst`.
void CopyToRing(void* dst, const void* src, size_t bytes);

// Writes `n` float32 values (as bits) rounded to bfloat16 and widened back:
// round to nearest even on the bits, as LibTorch's conversion does; a NaN
// becomes the quiet NaN 0x7fc00000.
void RoundBf16ToRing(uint32_t* dst, const uint32_t* src, int64_t n);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_STREAM_COPY_H_
