// Block-wise integer quantization of float32 tensors for the wire
// (COMPRESSION_INT8/INT4; the layout is QuantizedBlocks' in
// proto/stagewise/v1/tensor.proto). Everything runs on the tensor's own
// device, so on a GPU only the quantized bytes cross the bus.
#ifndef STAGEWISE_SERVICES_TENSOR_QUANTIZE_H_
#define STAGEWISE_SERVICES_TENSOR_QUANTIZE_H_

#include <torch/types.h>

#include <cstdint>

namespace stagewise {

// The seed of the random signs of the rotation when a job gives none.
inline constexpr uint64_t kDefaultRotationSeed = 0x9E3779B97F4A7C15ull;

struct QuantizedFormat {
  int bits = 8;             // 8 or 4
  int64_t block_size = 64;  // a power of two, 8..65536
  bool rotate = false;      // random Hadamard rotation of each block first
  uint64_t rotation_seed = kDefaultRotationSeed;
};

// Whether block_size is a power of two in [8, 65536] and bits 8 or 4.
bool ValidQuantizedFormat(const QuantizedFormat& format);

// Bytes of the payload for `numel` values: the scales, then the codes.
int64_t QuantizedPayloadBytes(int64_t numel, const QuantizedFormat& format);

// The largest code: 127 (int8) or 7 (int4). A value's error is at most half
// its block's scale (its block's largest magnitude / (2 x this)), in the
// rotated domain when the format rotates.
int64_t QuantizedMaxCode(int bits);

// Quantizes a float32 tensor (any shape and device) into a flat uint8 tensor
// of QuantizedPayloadBytes(numel) bytes on the same device; undefined when a
// block holds a NaN or an infinity (or the rotation overflows), which the
// format cannot carry.
torch::Tensor QuantizeBlocks(const torch::Tensor& values, const QuantizedFormat& format);

// The inverse: a flat uint8 payload (any device) back into `numel` float32
// values on the payload's device, as a flat tensor. The payload's size must
// be QuantizedPayloadBytes(numel) (the codec checks it before).
torch::Tensor DequantizeBlocks(const torch::Tensor& payload, int64_t numel,
                               const QuantizedFormat& format);

// How a GPU runs the two above: as tensor operations on the tensor's device
// (about fifteen passes over the values). On the CPU they run as one pass per
// block instead; the two give the same bytes and values (the tests hold them
// to it on the CPU).
torch::Tensor QuantizeBlocksByTensorOps(const torch::Tensor& values, const QuantizedFormat& format);
torch::Tensor DequantizeBlocksByTensorOps(const torch::Tensor& payload, int64_t numel,
                                          const QuantizedFormat& format);

// x [n, block] -> x H / sqrt(block) along the last dimension (orthonormal and
// its own inverse); block a power of two.
torch::Tensor WalshHadamard(const torch::Tensor& x);

// The random signs (+1/-1, float32, on `device`) of the rotation's diagonal.
torch::Tensor RotationSigns(int64_t block_size, uint64_t seed, torch::Device device);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_QUANTIZE_H_
