#include "services/tensor/stream_copy.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>

namespace stagewise {
namespace {

constexpr size_t kMinStreamed = 256 << 10;

uint32_t RoundBf16(uint32_t u) {
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return nan ? 0x7fc00000u : rounded;
}

#if defined(__x86_64__)
bool HaveAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

bool Streamed(const void* dst, size_t bytes) {
  return bytes >= kMinStreamed && reinterpret_cast<uintptr_t>(dst) % 32 == 0 && HaveAvx2();
}

// 128-byte steps of unaligned loads and aligned streaming stores; `bytes` a
// multiple of 128 (the caller copies the tail).
__attribute__((target("avx2"))) void StreamAvx2(uint8_t* dst, const uint8_t* src, size_t bytes) {
  auto* d = reinterpret_cast<__m256i*>(dst);
  const auto* s = reinterpret_cast<const __m256i*>(src);
  for (size_t i = 0; i < bytes / 32; i += 4) {
    const __m256i a = _mm256_loadu_si256(s + i);
    const __m256i b = _mm256_loadu_si256(s + i + 1);
    const __m256i c = _mm256_loadu_si256(s + i + 2);
    const __m256i e = _mm256_loadu_si256(s + i + 3);
    _mm256_stream_si256(d + i, a);
    _mm256_stream_si256(d + i + 1, b);
    _mm256_stream_si256(d + i + 2, c);
    _mm256_stream_si256(d + i + 3, e);
  }
  _mm_sfence();  // the stores are visible before the descriptor is sent
}

// RoundBf16 on 8 values a step; `n` a multiple of 8.
__attribute__((target("avx2"))) void RoundBf16Avx2(uint32_t* dst, const uint32_t* src, int64_t n) {
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i qnan = _mm256_set1_epi32(0x7fc00000);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded =
        _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), high);
    // |u| > inf as signed 32-bit integers (both sides are non-negative).
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, magnitude), inf);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_blendv_epi8(rounded, qnan, nan));
  }
  _mm_sfence();
}
#endif

}  // namespace

void CopyToRing(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (Streamed(dst, bytes)) {
    const size_t body = bytes / 128 * 128;
    StreamAvx2(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), body);
    std::memcpy(static_cast<uint8_t*>(dst) + body, static_cast<const uint8_t*>(src) + body,
                bytes - body);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void RoundBf16ToRing(uint32_t* dst, const uint32_t* src, int64_t n) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (n > 0 && Streamed(dst, static_cast<size_t>(n) * sizeof(uint32_t))) {
    i = n / 8 * 8;
    RoundBf16Avx2(dst, src, i);
  }
#endif
  // A loop the compiler vectorizes, as fast as a copy.
  for (; i < n; ++i) dst[i] = RoundBf16(src[i]);
}

}  // namespace stagewise
