#include "services/tensor/quantize.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace stagewise {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Codes sent: every value, or with the rotation every block's block_size.
int64_t CodeCount(int64_t numel, const QuantizedFormat& format) {
  return format.rotate ? CeilDiv(numel, format.block_size) * format.block_size : numel;
}

int64_t CodeBytes(int64_t codes, int bits) { return bits == 8 ? codes : CeilDiv(codes, 2); }

// The flat values padded with zeros to whole blocks, as [blocks, block_size].
torch::Tensor Blocks(const torch::Tensor& flat, int64_t block_size) {
  const int64_t numel = flat.numel();
  const int64_t padded = CeilDiv(numel, block_size) * block_size;
  torch::Tensor x = flat;
  if (padded != numel) x = torch::constant_pad_nd(flat, {0, padded - numel}, 0);
  return x.view({padded / block_size, block_size});
}

// int8 codes (flat) -> the int4 wire bytes: two's complement nibbles, the
// lower one first.
torch::Tensor PackNibbles(const torch::Tensor& codes) {
  torch::Tensor nibbles = codes.to(torch::kShort).bitwise_and(15);
  if (nibbles.numel() % 2 != 0) nibbles = torch::constant_pad_nd(nibbles, {0, 1}, 0);
  const torch::Tensor pairs = nibbles.view({-1, 2});
  return (pairs.select(1, 0) + pairs.select(1, 1) * 16).to(torch::kByte);
}

// The inverse: `count` signed codes (int16) from the wire bytes.
torch::Tensor UnpackNibbles(const torch::Tensor& bytes, int64_t count) {
  const torch::Tensor b = bytes.to(torch::kShort);
  const torch::Tensor lo = b.bitwise_and(15);
  const torch::Tensor hi = b.div(16, "floor");
  torch::Tensor nibbles = torch::stack({lo, hi}, 1).view({-1}).narrow(0, 0, count);
  return nibbles - nibbles.ge(8).to(torch::kShort) * 16;
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The CPU path: one pass per block over a float32 buffer, in plain loops
// the compiler vectorises (the tensor-operation path makes about fifteen
// passes over the whole tensor, which on a CPU costs more than the link
// time it saves). Same bytes as the tensor path: the same float operations
// in the same order, division by the scale, round half to even.
void FastHadamard(float* y, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
    }
  }
}

// The rotation's random signs, +1 or -1 from the top bit of SplitMix64.
std::vector<float> SignVector(int64_t block_size, uint64_t seed) {
  std::vector<float> signs(static_cast<size_t>(block_size));
  uint64_t state = seed;
  for (float& s : signs) s = (SplitMix64(&state) >> 63) != 0 ? -1.0f : 1.0f;
  return signs;
}
std::vector<float> SignsOf(const QuantizedFormat& f) {
  return f.rotate ? SignVector(f.block_size, f.rotation_seed) : std::vector<float>();
}

torch::Tensor QuantizeOnCpu(const float* v, int64_t numel, const QuantizedFormat& f) {
  const int64_t B = f.block_size;
  const int64_t blocks = CeilDiv(numel, B);
  const int64_t count = CodeCount(numel, f);
  torch::Tensor out = torch::empty({QuantizedPayloadBytes(numel, f)}, torch::kByte);
  auto* scales = reinterpret_cast<float*>(out.data_ptr<uint8_t>());  // 4-byte aligned
  uint8_t* code_bytes = out.data_ptr<uint8_t>() + blocks * 4;
  const std::vector<float> signs = SignsOf(f);
  const float root = static_cast<float>(std::sqrt(static_cast<double>(B)));
  const auto max_code = static_cast<float>(QuantizedMaxCode(f.bits));
  std::vector<float> buf(static_cast<size_t>(B));
  std::vector<int8_t> codes(static_cast<size_t>(B));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n = std::min(B, numel - b * B);
    std::copy(v + b * B, v + b * B + n, buf.begin());
    std::fill(buf.begin() + n, buf.end(), 0.0f);
    if (f.rotate) {
      for (int64_t i = 0; i < B; ++i) buf[i] *= signs[i];
      FastHadamard(buf.data(), B);
      for (int64_t i = 0; i < B; ++i) buf[i] /= root;
    }
    float amax = 0;
    bool finite = true;
    for (int64_t i = 0; i < B; ++i) {
      amax = std::max(amax, std::fabs(buf[i]));
      finite = finite && std::isfinite(buf[i]);
    }
    float scale = amax / max_code;
    if (!finite || !std::isfinite(scale)) return torch::Tensor();
    if (!std::isfinite(scale * max_code)) scale = std::nextafter(scale, 0.0f);
    scales[b] = scale;
    const float divisor = scale > 0 ? scale : 1.0f;
    for (int64_t i = 0; i < B; ++i) {
      codes[i] =
          static_cast<int8_t>(std::clamp(std::nearbyint(buf[i] / divisor), -max_code, max_code));
    }
    // This block's codes: all of them, or (unrotated) its n values.
    const int64_t first = b * B, last = std::min(first + B, count);
    for (int64_t i = first; i < last; ++i) {
      const int8_t c = codes[i - first];
      if (f.bits == 8) {
        code_bytes[i] = static_cast<uint8_t>(c);
      } else if (i % 2 == 0) {
        code_bytes[i / 2] = static_cast<uint8_t>(c & 15);
      } else {
        code_bytes[i / 2] = static_cast<uint8_t>(code_bytes[i / 2] | ((c & 15) << 4));
      }
    }
  }
  return out;
}

torch::Tensor DequantizeOnCpu(const uint8_t* bytes, int64_t numel, const QuantizedFormat& f) {
  const int64_t B = f.block_size;
  const int64_t blocks = CeilDiv(numel, B);
  const int64_t count = CodeCount(numel, f);
  std::vector<float> scales(static_cast<size_t>(blocks));
  std::memcpy(scales.data(), bytes, static_cast<size_t>(blocks) * 4);
  const uint8_t* code_bytes = bytes + blocks * 4;
  torch::Tensor out = torch::empty({numel}, torch::kFloat);
  float* x = out.data_ptr<float>();
  const std::vector<float> signs = SignsOf(f);
  const float root = static_cast<float>(std::sqrt(static_cast<double>(B)));
  std::vector<float> buf(static_cast<size_t>(B));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = b * B;
    for (int64_t i = 0; i < B; ++i) {
      const int64_t k = first + i;
      float code = 0;  // past the codes sent: the padding's zeros
      if (k < count) {
        if (f.bits == 8) {
          code = static_cast<float>(static_cast<int8_t>(code_bytes[k]));
        } else {
          const int nibble = (k % 2 == 0 ? code_bytes[k / 2] : code_bytes[k / 2] >> 4) & 15;
          code = static_cast<float>(nibble >= 8 ? nibble - 16 : nibble);
        }
      }
      buf[i] = code * scales[b];
    }
    if (f.rotate) {
      FastHadamard(buf.data(), B);
      for (int64_t i = 0; i < B; ++i) buf[i] = buf[i] / root * signs[i];
    }
    const int64_t n = std::min(B, numel - first);
    std::copy(buf.begin(), buf.begin() + n, x + first);
  }
  return out;
}

}  // namespace

bool ValidQuantizedFormat(const QuantizedFormat& format) {
  const int64_t b = format.block_size;
  return (format.bits == 8 || format.bits == 4) && b >= 8 && b <= 65536 && (b & (b - 1)) == 0;
}

int64_t QuantizedMaxCode(int bits) { return bits == 8 ? 127 : 7; }

int64_t QuantizedPayloadBytes(int64_t numel, const QuantizedFormat& format) {
  const int64_t blocks = CeilDiv(numel, format.block_size);
  return blocks * 4 + CodeBytes(CodeCount(numel, format), format.bits);
}

torch::Tensor RotationSigns(int64_t block_size, uint64_t seed, torch::Device device) {
  return torch::tensor(SignVector(block_size, seed), torch::kFloat).to(device);
}

torch::Tensor WalshHadamard(const torch::Tensor& x) {
  const int64_t n = x.size(0);
  const int64_t block = x.size(1);
  torch::Tensor y = x.contiguous();
  for (int64_t h = 1; h < block; h *= 2) {
    const torch::Tensor v = y.view({n, block / (2 * h), 2, h});
    const torch::Tensor a = v.select(2, 0);
    const torch::Tensor b = v.select(2, 1);
    y = torch::stack({a + b, a - b}, 2).view({n, block});
  }
  return y / std::sqrt(static_cast<double>(block));
}

torch::Tensor QuantizeBlocks(const torch::Tensor& values, const QuantizedFormat& format) {
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = values.detach().to(torch::kFloat).contiguous().view({-1});
  if (!flat.device().is_cpu()) return QuantizeBlocksByTensorOps(flat, format);
  return QuantizeOnCpu(flat.data_ptr<float>(), flat.numel(), format);
}

torch::Tensor QuantizeBlocksByTensorOps(const torch::Tensor& values,
                                        const QuantizedFormat& format) {
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = values.detach().to(torch::kFloat).contiguous().view({-1});
  const int64_t numel = flat.numel();
  torch::Tensor x = Blocks(flat, format.block_size);
  if (format.rotate) {
    x = WalshHadamard(x * RotationSigns(format.block_size, format.rotation_seed, x.device()));
  }
  const auto max_code = static_cast<double>(QuantizedMaxCode(format.bits));
  torch::Tensor scales = std::get<0>(x.abs().max(1)) / max_code;  // [blocks]
  // A NaN or an infinity (in the values, or from the rotation's sums) makes
  // its block's scale one.
  if (!torch::isfinite(scales).all().item<bool>()) return torch::Tensor();
  // The largest code times the scale must not round past float32's largest.
  scales = torch::where(torch::isfinite(scales * max_code), scales,
                        torch::nextafter(scales, torch::zeros_like(scales)));
  const torch::Tensor divisor = torch::where(scales.gt(0), scales, torch::ones_like(scales));
  torch::Tensor codes =
      (x / divisor.unsqueeze(1)).round().clamp(-max_code, max_code).to(torch::kChar).view({-1});
  codes = codes.narrow(0, 0, CodeCount(numel, format));
  const torch::Tensor code_bytes = format.bits == 8 ? codes.view(torch::kByte) : PackNibbles(codes);
  return torch::cat({scales.contiguous().view(torch::kByte), code_bytes});
}

torch::Tensor DequantizeBlocks(const torch::Tensor& payload, int64_t numel,
                               const QuantizedFormat& format) {
  const torch::Tensor bytes = payload.contiguous().view({-1});
  if (!bytes.device().is_cpu()) return DequantizeBlocksByTensorOps(bytes, numel, format);
  return DequantizeOnCpu(bytes.data_ptr<uint8_t>(), numel, format);
}

torch::Tensor DequantizeBlocksByTensorOps(const torch::Tensor& payload, int64_t numel,
                                          const QuantizedFormat& format) {
  torch::NoGradGuard no_grad;
  const int64_t blocks = CeilDiv(numel, format.block_size);
  const int64_t count = CodeCount(numel, format);
  const torch::Tensor bytes = payload.contiguous().view({-1});
  const torch::Tensor scales = bytes.narrow(0, 0, blocks * 4).clone().view(torch::kFloat);
  const torch::Tensor code_bytes = bytes.narrow(0, blocks * 4, CodeBytes(count, format.bits));
  const torch::Tensor codes = format.bits == 8 ? code_bytes.view(torch::kChar).to(torch::kFloat)
                                               : UnpackNibbles(code_bytes, count).to(torch::kFloat);
  torch::Tensor x = Blocks(codes, format.block_size) * scales.unsqueeze(1);
  if (format.rotate) {
    x = WalshHadamard(x) * RotationSigns(format.block_size, format.rotation_seed, x.device());
  }
  return x.view({-1}).narrow(0, 0, numel).contiguous();
}

}  // namespace stagewise
