#include "services/tensor/quantize.h"

#include <torch/torch.h>

#include <cmath>
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
  std::vector<float> signs(static_cast<size_t>(block_size));
  uint64_t state = seed;
  for (float& s : signs) s = (SplitMix64(&state) >> 63) != 0 ? -1.0f : 1.0f;
  return torch::tensor(signs, torch::kFloat).to(device);
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
