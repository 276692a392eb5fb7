// torch::Tensor <-> stagewise.v1.TensorProto.
#ifndef STAGEWISE_SERVICES_TENSOR_CODEC_H_
#define STAGEWISE_SERVICES_TENSOR_CODEC_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "services/tensor/quantize.h"
#include "services/tensor/shared_ring.h"
#include "stagewise/v1/tensor.pb.h"

namespace stagewise {

// Default cap on the decoded payload of one tensor (1 GiB).
inline constexpr int64_t kDefaultMaxTensorBytes = int64_t{1} << 30;

struct EncodeOptions {
  // Lossy wire compression of float32 tensors; other dtypes are sent as they
  // are. INT8/INT4 send a tensor with a NaN or an infinity uncompressed (the
  // receiver then sees exactly what diverged).
  v1::Compression compression = v1::COMPRESSION_NONE;
  // INT8/INT4: values per scale, and the random Hadamard rotation of each
  // block before quantizing (QuantizedBlocks in tensor.proto).
  int64_t block_size = 64;
  bool rotate = false;
  uint64_t rotation_seed = kDefaultRotationSeed;
  // Error feedback (lossy compression of float32): when set, *residual (if
  // defined and of the tensor's shape) is added to the tensor before it is
  // encoded, and *residual becomes what the encoding lost of that sum. Reset
  // (undefined) when a tensor goes uncompressed.
  torch::Tensor* residual = nullptr;
  // The sender's shared-memory ring towards a neighbour on this host that
  // opened it (null: none): a payload of at least min_shared_bytes goes there
  // (TensorProto.shared) when the ring has room, else inline.
  SharedRing* ring = nullptr;
  int64_t min_shared_bytes = 64 << 10;
  // With a ring, for a receiver on the CPU: an fp16/bf16 payload from a CPU
  // tensor goes into the ring as float32 values rounded through the narrow
  // type (exactly what the receiver would widen them to), uncompressed, in
  // one pass, so that the receiver reads them in place instead of widening
  // them. Inline payloads (a full ring) are narrowed as always.
  bool round_in_ring = false;
};

// Encodes a tensor (any device: narrowed or quantized there, then copied to
// the CPU or the ring) into `out`.
// Unsupported dtypes are INVALID_ARGUMENT.
absl::Status EncodeTensor(const torch::Tensor& tensor, v1::TensorProto* out,
                          const EncodeOptions& options = {});

// Before a send to a CPU receiver behind options->ring (round_in_ring), on
// the thread that computed `tensor`: a CPU float32 tensor of at least
// min_shared_bytes that goes as fp16/bf16 (without error feedback) is
// rounded through the narrow type into a tensor made in the ring
// (SharedRing::PlaceForSend; the ring must be owned by a shared_ptr), which
// is returned, and options->compression
// becomes COMPRESSION_NONE: the encoder hands it over as it is. Otherwise
// (no room, another case) `tensor` itself, options unchanged. `given_up`:
// the caller will not read `tensor` again, so one already made in the ring
// (a placed region of its size, not yet sent) is rounded where it lies and
// returned, with no second region.
torch::Tensor NarrowIntoRing(const torch::Tensor& tensor, EncodeOptions* options,
                             bool given_up = false);

// Checks a proto without decoding it: known dtype and compression, rank <= 8,
// non-negative dims, numel * itemsize == data.size(), size <= max_bytes.
absl::Status ValidateTensorProto(const v1::TensorProto& proto,
                                 int64_t max_bytes = kDefaultMaxTensorBytes);

// Validates, then decodes into a new CPU tensor that owns its memory (a copy
// of the payload).
absl::StatusOr<torch::Tensor> DecodeTensor(const v1::TensorProto& proto,
                                           int64_t max_bytes = kDefaultMaxTensorBytes);

struct DecodeOptions {
  int64_t max_bytes = kDefaultMaxTensorBytes;
  // Where the tensor is wanted: a compressed payload is copied there as it
  // came and widened (or dequantized) on that device.
  torch::Device device = torch::kCPU;
  // Called with the size of a payload buffer the tensor takes over (memory
  // LibTorch's allocator never saw); the function it returns runs when the
  // tensor frees the buffer. Workers charge it to the stage's memory meter.
  std::function<std::function<void()>(int64_t bytes)> charge;
};

// Validates, then decodes without copying: the tensor takes over the proto's
// payload buffer (the proto's data is left empty), so a message's tensors cost
// no copy beyond the one gRPC makes while parsing. Compressed payloads are
// widened to float32 on options.device; a payload that is not aligned for its
// dtype is copied.
absl::StatusOr<torch::Tensor> DecodeTensor(v1::TensorProto* proto,
                                           const DecodeOptions& options = {});

// A payload lent in place (TensorProto.shared.lease, ring_leases.h) becomes
// an inline copy in `data`, the lease left to whoever reads the original; a
// proto that is not lent is left as it is. For a proto copied from a received
// message to be passed on or kept.
absl::Status InlineLentPayload(v1::TensorProto* proto);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_CODEC_H_
