// Fuzz target: a StageMessage from a neighbouring stage, checked the way a
// worker checks it before use. The first byte picks the direction; the rest
// is the message. Invariants: a message that passes has the expected job, a
// kind allowed in that direction, bounded counts, and tensors that all
// decode; a refusal is INVALID_ARGUMENT with a short message.
#include <cstdint>
#include <string>

#include "services/tensor/codec.h"
#include "services/tensor/stage_message.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = QuietProtobufLogs();
  (void)quiet;
  if (size < 1) return 0;
  stagewise::v1::StageMessage message;
  if (!message.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  stagewise::StageMessageExpectation expect;
  expect.job_id = "job-1";
  expect.stage = 1;
  expect.from_prev = (data[0] & 1) != 0;
  stagewise::StageMessageLimits limits;
  limits.max_tensor_bytes = int64_t{1} << 20;
  const absl::Status s = stagewise::ValidateStageMessage(message, expect, limits);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, std::string(s.message()).c_str());
    FUZZ_CHECK(s.message().size() < 1024, "an error message echoes too much");
    return 0;
  }
  FUZZ_CHECK(message.job_id() == expect.job_id, "job");
  FUZZ_CHECK(message.tensors_size() <= limits.max_tensors, "tensor count");
  FUZZ_CHECK(message.step() >= 0 && message.micro_batch() >= 0, "negative step");
  if (message.kind() == stagewise::v1::StageMessage::OPEN) {
    FUZZ_CHECK(message.tensors_size() == 0 && message.scalars_size() == 0, "a loaded OPEN");
  }
  if (expect.from_prev) {
    FUZZ_CHECK(message.kind() != stagewise::v1::StageMessage::BACKWARD, "backward from j-1");
  } else {
    FUZZ_CHECK(message.kind() == stagewise::v1::StageMessage::BACKWARD ||
                   message.kind() == stagewise::v1::StageMessage::AUX,
               "forward from j+1");
  }
  for (const auto& [name, tensor] : message.tensors()) {
    auto decoded = stagewise::DecodeTensor(tensor, limits.max_tensor_bytes);
    FUZZ_CHECK(decoded.ok(), "a validated tensor does not decode");
  }
  return 0;
}
