// Fuzz target: a TensorProto off the wire, as a worker decodes it.
// Invariants: DecodeTensor succeeds exactly when ValidateTensorProto does;
// a decoded tensor has the shape and dtype the proto declared; an
// uncompressed tensor encodes back to the very same bytes; the decode that
// takes the payload over gives the same tensor as the copying one.
#include <cstdint>
#include <cstring>
#include <string>

#include "services/tensor/codec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = QuietProtobufLogs();
  (void)quiet;
  stagewise::v1::TensorProto proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  constexpr int64_t kMaxBytes = int64_t{1} << 20;  // keeps each run small
  const absl::Status valid = stagewise::ValidateTensorProto(proto, kMaxBytes);
  absl::StatusOr<torch::Tensor> tensor = stagewise::DecodeTensor(proto, kMaxBytes);
  FUZZ_CHECK(valid.ok() == tensor.ok(), "decode and validate disagree");
  // The worker's decode takes the payload over; it must agree with the copy.
  stagewise::v1::TensorProto taken = proto;
  stagewise::DecodeOptions options;
  options.max_bytes = kMaxBytes;
  absl::StatusOr<torch::Tensor> adopted = stagewise::DecodeTensor(&taken, options);
  FUZZ_CHECK(adopted.ok() == tensor.ok(), "adopting and copying decodes disagree");
  if (adopted.ok()) {
    FUZZ_CHECK(adopted->scalar_type() == tensor->scalar_type() &&
                   adopted->sizes() == tensor->sizes() &&
                   (tensor->nbytes() == 0 ||
                    std::memcmp(adopted->data_ptr(), tensor->data_ptr(), tensor->nbytes()) == 0),
               "adopting and copying decodes give different tensors");
  }
  if (!tensor.ok()) {
    FUZZ_CHECK(tensor.status().code() == absl::StatusCode::kInvalidArgument,
               std::string(tensor.status().message()).c_str());
    return 0;
  }
  FUZZ_CHECK(tensor->dim() == proto.shape_size(), "rank");
  for (int i = 0; i < proto.shape_size(); ++i) {
    FUZZ_CHECK(tensor->size(i) == proto.shape(i), "shape");
  }
  if (proto.compression() == stagewise::v1::COMPRESSION_NONE) {
    stagewise::v1::TensorProto again;
    const absl::Status encoded = stagewise::EncodeTensor(*tensor, &again);
    FUZZ_CHECK(encoded.ok(), std::string(encoded.message()).c_str());
    FUZZ_CHECK(again.dtype() == proto.dtype(), "dtype changed in a round trip");
    FUZZ_CHECK(again.data() == proto.data(), "bytes changed in a round trip");
  }
  return 0;
}
