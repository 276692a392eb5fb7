// Pieces every algorithm shares: tensors in messages, and the evaluation pass.
#ifndef STAGEWISE_WORKER_ALGORITHMS_COMMON_H_
#define STAGEWISE_WORKER_ALGORITHMS_COMMON_H_

#include <torch/torch.h>

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/status_macros.h"
#include "stagewise/v1/stage.pb.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

// A FORWARD message from stage j-1, decoded: the activation, the labels as
// they travel (re-sent untouched) and, on the last stage, decoded.
struct ForwardInput {
  torch::Tensor x;
  v1::TensorProto labels_proto;
  torch::Tensor labels;  // defined on the last stage, or with decode_labels
};

// Seconds since `t0` (compute-time metrics).
double SecondsSince(std::chrono::steady_clock::time_point t0);

// Mini-batch `step` as this stage sees it: stage 0 reads it from the data
// (labels decoded), later stages receive FORWARD `step` (micro-batch 0).
absl::StatusOr<ForwardInput> StageInput(StageContext& ctx, int64_t step);

// Receives FORWARD `step`/`micro_batch` from stage j-1 and decodes it (the
// labels too on the last stage or with `decode_labels`).
absl::StatusOr<ForwardInput> ReceiveForward(StageContext& ctx, int64_t step, int micro_batch,
                                            bool decode_labels = false);

// Sends `out` to stage j+1 as FORWARD with the labels: stage 0 encodes
// `labels`, later stages pass `labels_proto` on.
absl::Status SendForward(StageContext& ctx, int64_t step, int micro_batch, const torch::Tensor& out,
                         const torch::Tensor& labels, v1::TensorProto labels_proto);

v1::StageMessage NewMessage(v1::StageMessage::Kind kind, int64_t step, int micro_batch);
absl::Status PutTensor(v1::StageMessage* message, const std::string& name,
                       const torch::Tensor& tensor);
// Decodes tensors[name] onto `device`; INVALID_ARGUMENT naming the tensor if
// it is missing or malformed.
absl::StatusOr<torch::Tensor> GetTensor(const v1::StageMessage& message, const std::string& name,
                                        torch::Device device);
// INVALID_ARGUMENT unless the message has this kind, step and micro-batch.
absl::Status ExpectMessage(const v1::StageMessage& message, v1::StageMessage::Kind kind,
                           int64_t step, int micro_batch);

// Forward-only pass over the test set through the real stages in eval mode:
// stage 0 sends EVAL batches, the last stage reports loss and accuracy. Every
// stage calls it at the same point of its schedule.
absl::Status RunEvaluation(StageContext& ctx, int64_t steps_done);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_COMMON_H_
