// Checks a StageMessage that arrived from a neighbouring stage before any of
// it is used: the right job and direction, bounded counts and names, and
// every tensor well formed (see codec.h). Kept apart from the stage runtime
// so the fuzz target and the tests call exactly what a worker calls.
#ifndef STAGEWISE_SERVICES_TENSOR_STAGE_MESSAGE_H_
#define STAGEWISE_SERVICES_TENSOR_STAGE_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "services/tensor/codec.h"
#include "stagewise/v1/stage.pb.h"

namespace stagewise {

struct StageMessageLimits {
  int max_tensors = 32;        // named tensors in one message
  int max_scalars = 64;        // named scalars in one message
  size_t max_name_bytes = 64;  // each tensor or scalar name
  int64_t max_tensor_bytes = kDefaultMaxTensorBytes;
};

// What the receiving stage expects of its peer.
struct StageMessageExpectation {
  std::string job_id;
  int stage = 0;           // the receiving stage
  bool from_prev = false;  // true: from stage-1 (FORWARD/EVAL/AUX); false: from stage+1
};

// INVALID_ARGUMENT naming the offending field, or OK.
absl::Status ValidateStageMessage(const v1::StageMessage& message,
                                  const StageMessageExpectation& expect,
                                  const StageMessageLimits& limits = {});

// Copies every payload a message carries in the sender's shared-memory ring
// (TensorProto.shared) into the tensor's `data`, freeing its region, before
// anything else reads the message: INVALID_ARGUMENT naming the tensor when a
// payload has no ring to come from (`ring` null), is over max_tensor_bytes, or
// is not a live region of the ring. Then ValidateStageMessage checks the
// copies as it checks any payload. `widen`: a float32 tensor narrowed to
// fp16/bf16 for the wire is widened back on the way out of the ring (one pass,
// on the calling thread; the tensor then reads as uncompressed float32), where
// its widened size is within max_tensor_bytes: for receivers on the CPU, so
// that their compute thread takes it over without a conversion.
absl::Status ResolveSharedPayloads(v1::StageMessage* message, SharedRingView* ring,
                                   int64_t max_tensor_bytes = kDefaultMaxTensorBytes,
                                   bool widen = false);

struct ResolveOptions {
  int64_t max_tensor_bytes = kDefaultMaxTensorBytes;
  bool widen = false;  // as above
  // Not null: an uncompressed floating-point payload of at least
  // lend_min_bytes stays in the ring and is lent to the message
  // (ring_leases.h: TensorProto.shared.lease, under this owner and the
  // message's seq) when it is at most a quarter of the ring and the payloads
  // held in the ring stay within half of it (a held region is room the
  // writer cannot use; a write that finds no room goes inline); the others
  // are copied out as above.
  const void* lend_owner = nullptr;
  uint64_t lend_min_bytes = uint64_t{1} << 20;
  // With lend_owner: fp16/bf16 payloads are lent too, as they came (for a
  // receiver on a GPU, which copies them up and widens them there).
  bool lend_narrowed = false;
};
absl::Status ResolveSharedPayloads(v1::StageMessage* message, SharedRingView* ring,
                                   const ResolveOptions& options);

// The payload bytes of a message's tensors read in place (lent), which its
// serialized size does not count.
int64_t LentBytes(const v1::StageMessage& message);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_TENSOR_STAGE_MESSAGE_H_
