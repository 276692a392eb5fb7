#include "services/tensor/codec.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/tensor/device_copy.h"
#include "services/tensor/ring_leases.h"
#include "services/tensor/stream_copy.h"

// The wire format is little-endian and we memcpy element bytes verbatim, which
// is only correct on a little-endian host. Every platform we target (x86-64,
// aarch64) is; a big-endian port would need byte swapping here.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "stagewise tensor codec assumes a little-endian host");
#else
#error "cannot determine host byte order; the tensor codec needs little-endian"
#endif

namespace stagewise {
namespace {

// Mirrors proto/stagewise/v1/tensor.proto: DType_MAX is checked so a new enum
// value without a codec entry fails to build instead of being rejected at
// runtime as "unknown".
constexpr int kMaxRank = 8;
static_assert(v1::DType_MAX == v1::DTYPE_BOOL, "tensor.proto gained a dtype; add it to kDTypes");

struct DTypeInfo {
  v1::DType wire;
  c10::ScalarType torch;
  int64_t itemsize;
  const char* name;  // Short name used in error messages.
};

constexpr DTypeInfo kDTypes[] = {
    {v1::DTYPE_FLOAT32, c10::ScalarType::Float, 4, "float32"},
    {v1::DTYPE_FLOAT64, c10::ScalarType::Double, 8, "float64"},
    {v1::DTYPE_FLOAT16, c10::ScalarType::Half, 2, "float16"},
    {v1::DTYPE_BFLOAT16, c10::ScalarType::BFloat16, 2, "bfloat16"},
    {v1::DTYPE_INT64, c10::ScalarType::Long, 8, "int64"},
    {v1::DTYPE_INT32, c10::ScalarType::Int, 4, "int32"},
    {v1::DTYPE_UINT8, c10::ScalarType::Byte, 1, "uint8"},
    {v1::DTYPE_BOOL, c10::ScalarType::Bool, 1, "bool"},
};

// Compressed float32 travels as 2-byte elements of this torch dtype.
constexpr int64_t kCompressedItemsize = 2;

const DTypeInfo* FindByWire(int wire) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.wire == wire) return &info;
  }
  return nullptr;
}

const DTypeInfo* FindByTorch(c10::ScalarType type) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.torch == type) return &info;
  }
  return nullptr;
}

std::string ShapeString(const v1::TensorProto& proto) {
  return absl::StrCat("[", absl::StrJoin(proto.shape(), ", "), "]");
}

std::string CompressionName(int compression) {
  return v1::Compression_IsValid(compression)
             ? v1::Compression_Name(static_cast<v1::Compression>(compression))
             : absl::StrCat(compression);
}

bool IsQuantized(int compression) {
  return compression == v1::COMPRESSION_INT8 || compression == v1::COMPRESSION_INT4;
}

QuantizedFormat FormatOf(const EncodeOptions& options) {
  QuantizedFormat format;
  format.bits = options.compression == v1::COMPRESSION_INT4 ? 4 : 8;
  format.block_size = options.block_size;
  format.rotate = options.rotate;
  format.rotation_seed = options.rotation_seed;
  return format;
}

QuantizedFormat FormatOf(const v1::TensorProto& proto) {
  QuantizedFormat format;
  format.bits = proto.compression() == v1::COMPRESSION_INT4 ? 4 : 8;
  format.block_size = proto.quantized().block_size();
  format.rotate = proto.quantized().rotated();
  format.rotation_seed = proto.quantized().rotation_seed();
  return format;
}

int64_t NumelOf(const v1::TensorProto& proto) {
  int64_t numel = 1;
  for (int64_t dim : proto.shape()) numel *= dim;  // Validated: no overflow.
  return numel;
}

std::string LayoutName(c10::Layout layout) {
  std::ostringstream name;
  name << layout;
  return name.str();
}

// Checked int64 multiply; false on overflow.
bool CheckedMul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// Rejects bool bytes other than 0/1: LibTorch assumes a bool byte is exactly
// 0 or 1, and other values give inconsistent results in comparisons/reductions.
absl::Status CheckBoolBytes(const std::string& data) {
  for (size_t i = 0; i < data.size(); ++i) {
    const auto byte = static_cast<unsigned char>(data[i]);
    if (byte > 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor.data: byte %d of a bool tensor is %d, expected 0 or 1", i, byte));
    }
  }
  return absl::OkStatus();
}

// Writes `value` (CPU float32) rounded through `narrow` and widened back
// into `out`, a chunk at a time so that the narrow values stay in cache: one
// pass over the memory.
void RoundThrough(const torch::Tensor& value, c10::ScalarType narrow, float* out) {
  constexpr int64_t kChunk = 16384;
  const torch::Tensor flat = value.contiguous().view({-1});
  const int64_t n = flat.numel();
  if (narrow == torch::kBFloat16) {
    // bf16 is float32's upper half: rounded on the bits, as fast as a copy.
    RoundBf16ToRing(reinterpret_cast<uint32_t*>(out), static_cast<const uint32_t*>(flat.data_ptr()),
                    n);
    return;
  }
  torch::Tensor narrowed = torch::empty({std::min(n, kChunk)}, narrow);
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t len = std::min(kChunk, n - at);
    torch::Tensor part = narrowed.narrow(0, 0, len);
    part.copy_(flat.narrow(0, at, len));
    torch::from_blob(out + at, {len}, torch::kFloat).copy_(part);
  }
}

absl::Status EncodeImpl(const torch::Tensor& tensor, v1::TensorProto* out,
                        const EncodeOptions& options) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError("tensor: cannot encode an undefined tensor");
  }
  if (tensor.layout() != c10::kStrided) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor: layout ", LayoutName(tensor.layout()),
                     " is not supported; only dense (strided) tensors are"));
  }
  const DTypeInfo* info = FindByTorch(tensor.scalar_type());
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor: dtype ", c10::toString(tensor.scalar_type()), " is not supported on the wire"));
  }
  if (tensor.dim() > kMaxRank) {
    // The decoder would reject it; fail on the sending side where the bug is.
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor: rank %d exceeds the maximum of %d", tensor.dim(), kMaxRank));
  }
  if (!v1::Compression_IsValid(options.compression)) {
    return absl::InvalidArgumentError(absl::StrCat("options.compression: unknown compression ",
                                                   static_cast<int>(options.compression)));
  }

  if (IsQuantized(options.compression)) {
    QuantizedFormat format;
    format.block_size = options.block_size;
    if (!ValidQuantizedFormat(format)) {
      return absl::InvalidArgumentError(absl::StrCat("options.block_size: ", options.block_size,
                                                     " is not a power of two in [8, 65536]"));
    }
  }

  // resolve_* materialise lazy neg/conj views, whose raw bytes would otherwise
  // be the un-negated storage even after contiguous().
  torch::Tensor wire = tensor.detach().resolve_conj().resolve_neg();
  // Set when `wire` is a CPU float32 tensor still to be narrowed to this type:
  // into the shared ring in one pass (no narrowed copy in between).
  std::optional<c10::ScalarType> narrow_on_copy;
  v1::Compression compression = v1::COMPRESSION_NONE;
  out->Clear();
  if (info->wire == v1::DTYPE_FLOAT32 && options.compression != v1::COMPRESSION_NONE) {
    // Narrowed or quantized where the tensor is (on a GPU, before the copy:
    // fewer bytes cross the bus and the GPU converts), with the same rounding
    // as on the CPU.
    torch::Tensor value = wire;
    torch::Tensor* residual = options.residual;
    if (residual != nullptr && residual->defined() && residual->sizes() == value.sizes()) {
      value = value + residual->to(value.device());
    }
    compression = options.compression;
    if (IsQuantized(compression)) {
      const QuantizedFormat format = FormatOf(options);
      torch::Tensor payload = QuantizeBlocks(value, format);
      if (!payload.defined()) {
        // A NaN or an infinity: the tensor goes exactly as it is (a diverged
        // value must reach the receiver), and the residual is dropped.
        compression = v1::COMPRESSION_NONE;
        if (residual != nullptr) *residual = torch::Tensor();
      } else {
        wire = std::move(payload);
        out->mutable_quantized()->set_block_size(static_cast<uint32_t>(format.block_size));
        out->mutable_quantized()->set_rotated(format.rotate);
        if (format.rotate) out->mutable_quantized()->set_rotation_seed(format.rotation_seed);
        if (residual != nullptr) {
          *residual = value - DequantizeBlocks(wire, value.numel(), format).view(value.sizes());
        }
      }
    } else {
      // Out-of-range values saturate to inf under fp16; bf16 keeps float32's
      // exponent range. That trade-off is the caller's choice.
      const c10::ScalarType narrow =
          compression == v1::COMPRESSION_FP16 ? torch::kHalf : torch::kBFloat16;
      if (residual == nullptr && options.ring != nullptr && value.is_cpu()) {
        narrow_on_copy = narrow;
      } else {
        wire = value.to(narrow);
        if (residual != nullptr) *residual = value - wire.to(torch::kFloat);
      }
    }
  }
  out->set_dtype(info->wire);
  out->set_compression(compression);
  for (int64_t dim : tensor.sizes()) out->add_shape(dim);
  if (narrow_on_copy && options.round_in_ring &&
      wire.numel() * static_cast<int64_t>(sizeof(float)) >= options.min_shared_bytes) {
    const auto bytes = static_cast<uint64_t>(wire.numel()) * sizeof(float);
    if (auto region = options.ring->Allocate(bytes)) {
      RoundThrough(wire, *narrow_on_copy, reinterpret_cast<float*>(region->data));
      out->set_compression(v1::COMPRESSION_NONE);
      out->mutable_shared()->set_offset(region->offset);
      out->mutable_shared()->set_length(region->length);
      return absl::OkStatus();
    }
  }
  const c10::ScalarType wire_type = narrow_on_copy.value_or(wire.scalar_type());
  const int64_t wire_bytes = wire.numel() * static_cast<int64_t>(c10::elementSize(wire_type));
  if (options.ring != nullptr && !narrow_on_copy && wire.is_cpu() && wire.is_contiguous() &&
      wire_bytes > 0) {
    // Made in the ring already (host_blocks.h, placement): handed over as it is.
    if (auto offset = options.ring->Publish(wire.data_ptr(), static_cast<uint64_t>(wire_bytes))) {
      out->mutable_shared()->set_offset(*offset);
      out->mutable_shared()->set_length(static_cast<uint64_t>(wire_bytes));
      return absl::OkStatus();
    }
  }
  if (options.ring != nullptr && wire_bytes >= options.min_shared_bytes) {
    if (auto region = options.ring->Allocate(static_cast<uint64_t>(wire_bytes))) {
      // One pass straight into the shared pages (from the device, too;
      // narrowing on the way from the CPU).
      if (!narrow_on_copy && wire.is_cpu() && wire.is_contiguous()) {
        CopyToRing(region->data, wire.data_ptr(), static_cast<size_t>(wire_bytes));
      } else if (!narrow_on_copy && wire.is_cuda() && DeviceCopiesEnabled()) {
        CopyToHost(wire, region->data);  // into the pinned ring on the copy stream
      } else {
        torch::from_blob(region->data, wire.sizes(), torch::TensorOptions().dtype(wire_type))
            .copy_(wire);
      }
      out->mutable_shared()->set_offset(region->offset);
      out->mutable_shared()->set_length(region->length);
      return absl::OkStatus();
    }
  }
  if (narrow_on_copy) wire = wire.to(*narrow_on_copy);  // the ring was full: inline
  const torch::Tensor cpu = wire.to(torch::kCPU).contiguous();
  const size_t nbytes = static_cast<size_t>(cpu.numel()) * cpu.element_size();
  if (nbytes > 0) {
    out->mutable_data()->assign(static_cast<const char*>(cpu.data_ptr()), nbytes);
  }
  return absl::OkStatus();
}

c10::ScalarType WireType(const v1::TensorProto& proto, const DTypeInfo& info) {
  if (proto.compression() == v1::COMPRESSION_FP16) return torch::kHalf;
  if (proto.compression() == v1::COMPRESSION_BF16) return torch::kBFloat16;
  if (IsQuantized(proto.compression())) return torch::kByte;
  return info.torch;
}

// The wire's elements (as they came: the payload's dtype, flat when
// quantized) moved to `device`, then widened or dequantized there.
torch::Tensor FromWire(torch::Tensor wire, const v1::TensorProto& proto, const DTypeInfo& info,
                       torch::Device device) {
  if (wire.device() != device) {
    wire = wire.is_cpu() && device.is_cuda() && DeviceCopiesEnabled() ? CopyToDevice(wire, device)
                                                                      : wire.to(device);
  }
  if (IsQuantized(proto.compression())) {
    const std::vector<int64_t> shape(proto.shape().begin(), proto.shape().end());
    return DequantizeBlocks(wire, NumelOf(proto), FormatOf(proto)).view(shape);
  }
  if (wire.scalar_type() != info.torch) wire = wire.to(info.torch);
  return wire;
}

std::vector<int64_t> WireShape(const v1::TensorProto& proto) {
  if (IsQuantized(proto.compression())) {
    return {static_cast<int64_t>(proto.data().size())};
  }
  return std::vector<int64_t>(proto.shape().begin(), proto.shape().end());
}

absl::StatusOr<torch::Tensor> DecodeImpl(const v1::TensorProto& proto, torch::Device device) {
  const DTypeInfo* info = FindByWire(proto.dtype());
  const c10::ScalarType wire_type = WireType(proto, *info);

  // Copy out of the proto so the tensor outlives the message that carried it.
  torch::Tensor tensor = torch::empty(WireShape(proto), torch::TensorOptions().dtype(wire_type));
  const std::string& data = proto.data();
  if (!data.empty()) std::memcpy(tensor.data_ptr(), data.data(), data.size());
  return FromWire(tensor, proto, *info, device);
}

// A lent payload's lease was taken or returned already.
absl::Status LeaseGone() {
  return absl::FailedPreconditionError(
      "tensor.shared.lease: the payload was released before it was read (a message's tensors "
      "are read before the next message from the same neighbour is received)");
}

// Takes a lent payload's lease over: the tensor reads the ring in place and
// releases the region when it is freed.
absl::StatusOr<torch::Tensor> AdoptLent(v1::TensorProto* proto, const DecodeOptions& options,
                                        const DTypeInfo& info) {
  std::optional<RingLease> lease = RingLeases::Take(proto->shared().lease());
  if (!lease.has_value()) return LeaseGone();
  proto->clear_shared();
  std::function<void()> uncharge;
  if (options.charge) uncharge = options.charge(static_cast<int64_t>(lease->length()));
  auto owned = std::make_shared<RingLease>(std::move(*lease));
  torch::Tensor tensor = torch::from_blob(
      owned->bytes(), WireShape(*proto),
      [owned, uncharge](void*) mutable {
        owned.reset();
        if (uncharge) uncharge();
      },
      torch::TensorOptions().dtype(WireType(*proto, info)));
  return FromWire(tensor, *proto, info, options.device);
}

absl::StatusOr<torch::Tensor> AdoptImpl(v1::TensorProto* proto, const DecodeOptions& options) {
  const DTypeInfo* info = FindByWire(proto->dtype());
  if (proto->has_shared()) return AdoptLent(proto, options, *info);
  const c10::ScalarType wire_type = WireType(*proto, *info);
  const auto item = static_cast<uintptr_t>(c10::elementSize(wire_type));
  if (reinterpret_cast<uintptr_t>(proto->data().data()) % item != 0) {
    return DecodeImpl(*proto, options.device);
  }
  if (proto->data().empty()) {
    // No elements: nothing to take over (an empty field has no buffer of its own).
    const std::vector<int64_t> shape(proto->shape().begin(), proto->shape().end());
    return torch::empty(shape, torch::TensorOptions().dtype(info->torch).device(options.device));
  }
  const std::vector<int64_t> shape = WireShape(*proto);
  // Shared, so the buffer is freed (and uncharged) whether from_blob
  // succeeds or throws.
  std::function<void()> uncharge;
  if (options.charge) uncharge = options.charge(static_cast<int64_t>(proto->data().size()));
  std::shared_ptr<std::string> owned(proto->release_data(), [uncharge](std::string* s) {
    delete s;
    if (uncharge) uncharge();
  });
  char* bytes = owned->data();
  torch::Tensor tensor = torch::from_blob(
      bytes, shape, [owned](void*) mutable { owned.reset(); },
      torch::TensorOptions().dtype(wire_type));
  return FromWire(tensor, *proto, *info, options.device);
}

}  // namespace

torch::Tensor NarrowIntoRing(const torch::Tensor& tensor, EncodeOptions* options, bool given_up) {
  const v1::Compression c = options->compression;
  if ((c != v1::COMPRESSION_FP16 && c != v1::COMPRESSION_BF16) || options->ring == nullptr ||
      !options->round_in_ring || options->residual != nullptr || !tensor.defined() ||
      !tensor.is_cpu() || tensor.layout() != c10::kStrided ||
      tensor.scalar_type() != torch::kFloat) {
    return tensor;
  }
  const int64_t bytes = tensor.numel() * static_cast<int64_t>(sizeof(float));
  if (bytes < options->min_shared_bytes || bytes == 0) return tensor;
  SharedRing* ring = options->ring;
  const c10::ScalarType narrow = c == v1::COMPRESSION_FP16 ? torch::kHalf : torch::kBFloat16;
  if (given_up && tensor.is_contiguous() && !tensor.is_conj() && !tensor.is_neg() &&
      ring->IsPlaced(tensor.data_ptr(), static_cast<uint64_t>(bytes))) {
    RoundThrough(tensor, narrow, tensor.data_ptr<float>());  // made in the ring: rounded there
    options->compression = v1::COMPRESSION_NONE;
    return tensor;
  }
  void* placed = ring->PlaceForSend(static_cast<size_t>(bytes));
  if (placed == nullptr) return tensor;  // no room: narrowed when sent
  torch::Tensor out = torch::from_blob(
      placed, tensor.sizes(), [ring](void* data) { ring->Unplace(data); }, torch::kFloat);
  RoundThrough(tensor.detach().resolve_conj().resolve_neg(), narrow, out.data_ptr<float>());
  options->compression = v1::COMPRESSION_NONE;
  return out;
}

absl::Status EncodeTensor(const torch::Tensor& tensor, v1::TensorProto* out,
                          const EncodeOptions& options) {
  if (out == nullptr) {
    return absl::InvalidArgumentError("out: must not be null");
  }
  try {
    return EncodeImpl(tensor, out, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("EncodeTensor: LibTorch error: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("EncodeTensor: ", e.what()));
  }
}

absl::Status ValidateTensorProto(const v1::TensorProto& proto, int64_t max_bytes) {
  // proto3 enums are open: an unknown number from a newer peer parses fine and
  // must be rejected here.
  if (proto.dtype() == v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError("tensor.dtype: dtype is DTYPE_UNSPECIFIED");
  }
  const DTypeInfo* info = FindByWire(proto.dtype());
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.dtype: unknown dtype ", static_cast<int>(proto.dtype())));
  }
  if (!v1::Compression_IsValid(proto.compression())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.compression: unknown compression ",
                                                   static_cast<int>(proto.compression())));
  }
  // Lent: the receiving stage kept the payload in the peer's ring
  // (ring_leases.h); its size is checked like data's.
  const bool lent = proto.has_shared() && proto.shared().lease() != 0;
  if (proto.has_shared() && !lent) {
    return absl::InvalidArgumentError(
        "tensor.shared: a shared-memory payload on a stream that did not agree on a ring");
  }
  const bool narrowed =
      proto.compression() == v1::COMPRESSION_FP16 || proto.compression() == v1::COMPRESSION_BF16;
  if (lent &&
      (!proto.data().empty() || (proto.compression() != v1::COMPRESSION_NONE && !narrowed) ||
       !c10::isFloatingType(info->torch))) {
    return absl::InvalidArgumentError(
        "tensor.shared.lease: only a floating-point payload, uncompressed or fp16/bf16, without "
        "data, is read in place");
  }
  if (proto.has_quantized() != IsQuantized(proto.compression())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.quantized: ", proto.has_quantized() ? "set" : "missing", " with ",
                     CompressionName(proto.compression())));
  }
  if (proto.has_quantized() && !ValidQuantizedFormat(FormatOf(proto))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.quantized.block_size: ", proto.quantized().block_size(),
                     " is not a power of two in [8, 65536]"));
  }
  if (proto.compression() != v1::COMPRESSION_NONE && info->wire != v1::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor.compression: ", CompressionName(proto.compression()),
                     " requires dtype float32, got ", info->name));
  }
  if (proto.shape_size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor.shape: rank %d exceeds the maximum of %d", proto.shape_size(), kMaxRank));
  }

  // LibTorch computes contiguous strides and storage sizes as products of
  // max(dim, 1), so bound that product (times the item size) rather than
  // numel alone: a shape like [2^62, 2^62, 0] has no elements yet would
  // overflow torch's stride arithmetic.
  int64_t numel = 1;
  int64_t bound = 1;
  for (int i = 0; i < proto.shape_size(); ++i) {
    const int64_t dim = proto.shape(i);
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor.shape[%d]: dimension %d is negative", i, dim));
    }
    if (!CheckedMul(bound, dim == 0 ? 1 : dim, &bound)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor.shape: element count of shape ",
                                                     ShapeString(proto), " overflows int64"));
    }
    numel *= dim;  // Cannot overflow: numel <= bound, checked just above.
  }
  int64_t bound_bytes = 0;
  if (!CheckedMul(bound, info->itemsize, &bound_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shape: byte size of shape ",
                                                   ShapeString(proto), " ", info->name,
                                                   " overflows int64"));
  }
  const int64_t decoded_bytes = numel * info->itemsize;  // <= bound_bytes.
  if (decoded_bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor: decoded size %d bytes for shape %s %s exceeds the limit of "
                        "%d bytes",
                        decoded_bytes, ShapeString(proto), info->name, max_bytes));
  }

  const bool quantized = IsQuantized(proto.compression());
  const bool halved = !quantized && proto.compression() != v1::COMPRESSION_NONE;
  // Compressed payloads are smaller than float32's 4 bytes a value: no overflow.
  const int64_t expected_bytes = quantized ? QuantizedPayloadBytes(numel, FormatOf(proto))
                                 : halved  ? numel * kCompressedItemsize
                                           : decoded_bytes;
  const uint64_t payload_bytes = lent ? proto.shared().length() : proto.data().size();
  if (payload_bytes != static_cast<uint64_t>(expected_bytes)) {
    std::string how;
    if (halved)
      how = absl::StrCat(" (", CompressionName(proto.compression()), ", 2 bytes per element)");
    if (quantized) {
      how = absl::StrCat(" (", CompressionName(proto.compression()), ", blocks of ",
                         proto.quantized().block_size(),
                         proto.quantized().rotated() ? ", rotated" : "", ")");
    }
    return absl::InvalidArgumentError(absl::StrCat(
        lent ? "tensor.shared.length: " : "tensor.data: ", payload_bytes, " bytes, expected ",
        expected_bytes, " for shape ", ShapeString(proto), " ", info->name, how));
  }
  if (info->wire == v1::DTYPE_BOOL) return CheckBoolBytes(proto.data());
  return absl::OkStatus();
}

absl::Status InlineLentPayload(v1::TensorProto* proto) {
  if (!proto->has_shared() || proto->shared().lease() == 0) return absl::OkStatus();
  const uint64_t id = proto->shared().lease(), length = proto->shared().length();
  std::string data;
  if (!RingLeases::Read(id, [&data, length](const uint8_t* bytes) {
        data.assign(reinterpret_cast<const char*>(bytes), length);
      })) {
    return LeaseGone();
  }
  proto->clear_shared();
  proto->set_data(std::move(data));
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> DecodeTensor(const v1::TensorProto& proto, int64_t max_bytes) {
  if (absl::Status status = ValidateTensorProto(proto, max_bytes); !status.ok()) {
    return status;
  }
  if (proto.has_shared()) {
    // Lent (validated above): a copy of the bytes, the lease left to its reader.
    v1::TensorProto copy = proto;
    if (absl::Status s = InlineLentPayload(&copy); !s.ok()) return s;
    return DecodeTensor(copy, max_bytes);
  }
  try {
    return DecodeImpl(proto, torch::kCPU);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("DecodeTensor: LibTorch error: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("DecodeTensor: ", e.what()));
  }
}

absl::StatusOr<torch::Tensor> DecodeTensor(v1::TensorProto* proto, const DecodeOptions& options) {
  if (proto == nullptr) return absl::InvalidArgumentError("proto: must not be null");
  if (absl::Status status = ValidateTensorProto(*proto, options.max_bytes); !status.ok()) {
    return status;
  }
  try {
    return AdoptImpl(proto, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("DecodeTensor: LibTorch error: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("DecodeTensor: ", e.what()));
  }
}

}  // namespace stagewise
