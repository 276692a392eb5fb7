#include "services/tensor/stage_message.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "services/tensor/ring_leases.h"

namespace stagewise {
namespace {

// A peer's string, short and printable, for an error message.
std::string Shown(const std::string& text) {
  constexpr size_t kShown = 64;
  std::string out;
  for (char c : text.substr(0, kShown)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u >= 0x7f) ? '?' : c;
  }
  if (text.size() > kShown) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

absl::Status CheckName(const char* field, const std::string& name,
                       const StageMessageLimits& limits) {
  if (name.empty() || name.size() > limits.max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("StageMessage.", field, ": name '", Shown(name),
                                                   "' must have 1 to ", limits.max_name_bytes,
                                                   " bytes"));
  }
  return absl::OkStatus();
}

// Takes `tensor`'s fp16/bf16 payload out of `ring` as float32 (same values
// as decoding it), and marks it uncompressed.
absl::Status TakeWidened(SharedRingView& ring, v1::TensorProto* tensor) {
  const uint64_t length = tensor->shared().length();
  const auto n = static_cast<int64_t>(length / 2);
  std::string* data = tensor->mutable_data();
  data->resize(static_cast<size_t>(n) * sizeof(float));
  const c10::ScalarType narrow =
      tensor->compression() == v1::COMPRESSION_FP16 ? torch::kHalf : torch::kBFloat16;
  try {
    absl::Status taken = ring.TakeWith(tensor->shared().offset(), length, [&](const uint8_t* b) {
      torch::from_blob(data->data(), {n}, torch::kFloat)
          .copy_(torch::from_blob(const_cast<uint8_t*>(b), {n}, narrow));
    });
    if (!taken.ok()) {
      data->clear();
      return taken;
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("widening: ", e.what_without_backtrace()));
  }
  tensor->set_compression(v1::COMPRESSION_NONE);
  return absl::OkStatus();
}

bool IsFloatingWire(v1::DType dtype) {
  return dtype == v1::DTYPE_FLOAT32 || dtype == v1::DTYPE_FLOAT64 || dtype == v1::DTYPE_FLOAT16 ||
         dtype == v1::DTYPE_BFLOAT16;
}

}  // namespace

absl::Status ValidateStageMessage(const v1::StageMessage& m, const StageMessageExpectation& expect,
                                  const StageMessageLimits& limits) {
  if (m.job_id() != expect.job_id) {
    return absl::InvalidArgumentError(absl::StrCat("StageMessage.job_id: '", Shown(m.job_id()),
                                                   "' is not the job of this stage ('",
                                                   expect.job_id, "')"));
  }
  const auto kind = m.kind();
  const bool ok_kind = expect.from_prev
                           ? (kind == v1::StageMessage::FORWARD || kind == v1::StageMessage::EVAL ||
                              kind == v1::StageMessage::AUX || kind == v1::StageMessage::OPEN ||
                              kind == v1::StageMessage::RING)
                           : (kind == v1::StageMessage::BACKWARD || kind == v1::StageMessage::AUX ||
                              kind == v1::StageMessage::RING || kind == v1::StageMessage::RESUME);
  if (!ok_kind) {
    const std::string name = v1::StageMessage::Kind_IsValid(kind)
                                 ? v1::StageMessage::Kind_Name(kind)
                                 : absl::StrCat("unknown kind ", static_cast<int>(kind));
    return absl::InvalidArgumentError(absl::StrCat("StageMessage.kind: ", name,
                                                   " cannot come from stage ",
                                                   expect.stage + (expect.from_prev ? -1 : 1)));
  }
  if (m.step() < 0 || m.micro_batch() < 0) {
    return absl::InvalidArgumentError("StageMessage.step/micro_batch: negative");
  }
  if (m.checkpoint_step() != 0 &&
      (m.checkpoint_step() < 0 || !expect.from_prev ||
       (kind != v1::StageMessage::FORWARD && kind != v1::StageMessage::AUX))) {
    return absl::InvalidArgumentError(
        "StageMessage.checkpoint_step: only a positive step on FORWARD or AUX from stage j-1");
  }
  const bool handshake = kind == v1::StageMessage::OPEN || kind == v1::StageMessage::RING ||
                         kind == v1::StageMessage::RESUME;
  if (handshake && (m.tensors_size() > 0 || m.scalars_size() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("StageMessage: an ",
                                                   v1::StageMessage::Kind_Name(kind),
                                                   " message carries no tensors or scalars"));
  }
  if (m.seq() < 0 || m.held_seq() < 0) {
    return absl::InvalidArgumentError("StageMessage.seq/held_seq: negative");
  }
  if (handshake ? m.seq() != 0 : (m.held_seq() != 0 || m.resume())) {
    return absl::InvalidArgumentError(
        "StageMessage.seq: only on data messages; held_seq and resume: only on OPEN and RESUME");
  }
  if (m.resume() && kind != v1::StageMessage::OPEN) {
    return absl::InvalidArgumentError("StageMessage.resume: only on OPEN");
  }
  if (m.has_ring() && !handshake) {
    return absl::InvalidArgumentError("StageMessage.ring: only on OPEN and RING messages");
  }
  if (m.has_ring() && (m.ring().name().size() > 64 ||
                       (!m.ring().name().empty() && m.ring().token().size() != 16))) {
    return absl::InvalidArgumentError(
        "StageMessage.ring: a name of at most 64 bytes and a token of 16 bytes");
  }
  if (m.tensors_size() > limits.max_tensors) {
    return absl::InvalidArgumentError(absl::StrCat("StageMessage.tensors: ", m.tensors_size(),
                                                   " tensors, at most ", limits.max_tensors));
  }
  if (m.scalars_size() > limits.max_scalars) {
    return absl::InvalidArgumentError(absl::StrCat("StageMessage.scalars: ", m.scalars_size(),
                                                   " scalars, at most ", limits.max_scalars));
  }
  for (const auto& [name, value] : m.scalars()) {
    if (absl::Status s = CheckName("scalars", name, limits); !s.ok()) return s;
  }
  for (const auto& [name, tensor] : m.tensors()) {
    if (absl::Status s = CheckName("tensors", name, limits); !s.ok()) return s;
    if (absl::Status s = ValidateTensorProto(tensor, limits.max_tensor_bytes); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageMessage.tensors['", name, "']: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveSharedPayloads(v1::StageMessage* message, SharedRingView* ring,
                                   int64_t max_tensor_bytes, bool widen) {
  ResolveOptions options;
  options.max_tensor_bytes = max_tensor_bytes;
  options.widen = widen;
  return ResolveSharedPayloads(message, ring, options);
}

absl::Status ResolveSharedPayloads(v1::StageMessage* message, SharedRingView* ring,
                                   const ResolveOptions& options) {
  for (auto& [name, tensor] : *message->mutable_tensors()) {
    if (!tensor.has_shared()) continue;
    const auto where = [&name = name](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageMessage.tensors['", name.substr(0, 64), "']: ", why));
    };
    if (tensor.shared().lease() != 0) {
      return where("tensor.shared.lease: set by the sender (only the receiving stage sets it)");
    }
    if (ring == nullptr) {
      return where(
          "tensor.shared: a shared-memory payload on a stream that did not agree on a ring");
    }
    if (!tensor.data().empty()) return where("tensor.shared: set together with data");
    if (tensor.shared().length() > static_cast<uint64_t>(options.max_tensor_bytes)) {
      return where(absl::StrCat("tensor.shared: ", tensor.shared().length(),
                                " bytes exceed the limit of ", options.max_tensor_bytes));
    }
    const uint64_t length = tensor.shared().length();
    const bool narrowed = tensor.compression() == v1::COMPRESSION_FP16 ||
                          tensor.compression() == v1::COMPRESSION_BF16;
    if (options.lend_owner != nullptr &&
        (tensor.compression() == v1::COMPRESSION_NONE || (options.lend_narrowed && narrowed)) &&
        IsFloatingWire(tensor.dtype()) && length >= options.lend_min_bytes &&
        length <= ring->size() / 4 && ring->held_bytes() + length <= ring->size() / 2) {
      // Read in place: the region stays held until the tensor is freed (or
      // the lease is returned unread).
      absl::StatusOr<uint8_t*> bytes = ring->Hold(tensor.shared().offset(), length);
      if (!bytes.ok()) return where(bytes.status().message());
      tensor.mutable_shared()->set_lease(RingLeases::Lend(
          options.lend_owner, message->seq(),
          RingLease(ring->shared_from_this(), tensor.shared().offset(), length, *bytes)));
      continue;
    }
    absl::Status taken;
    if (options.widen && narrowed && tensor.dtype() == v1::DTYPE_FLOAT32 && length % 2 == 0 &&
        2 * length <= static_cast<uint64_t>(options.max_tensor_bytes)) {
      taken = TakeWidened(*ring, &tensor);
    } else {
      taken = ring->Take(tensor.shared().offset(), length, tensor.mutable_data());
    }
    if (!taken.ok()) return where(taken.message());
    tensor.clear_shared();
  }
  return absl::OkStatus();
}

int64_t LentBytes(const v1::StageMessage& message) {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : message.tensors()) {
    if (tensor.has_shared() && tensor.shared().lease() != 0) {
      bytes += static_cast<int64_t>(tensor.shared().length());
    }
  }
  return bytes;
}

}  // namespace stagewise
