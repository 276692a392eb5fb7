// Pieces every algorithm shares: tensors in messages, the optimizer step,
// shape checks, the last stage's loss, auxiliary modules and the evaluation
// pass. The schedules live in worker/algorithms/schedule.h.
#ifndef STAGEWISE_WORKER_ALGORITHMS_COMMON_H_
#define STAGEWISE_WORKER_ALGORITHMS_COMMON_H_

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// Records [t0, t1) as a span of mini-batch `step`, micro-batch `micro_batch`
// in the job's pipeline timeline, when the job traces that step.
void TraceSpan(StageContext& ctx, v1::SpanKind kind, int64_t step, int micro_batch,
               std::chrono::steady_clock::time_point t0,
               std::chrono::steady_clock::time_point t1 = std::chrono::steady_clock::now());
// Compute phase `phase` ("forward", "backward", "backward_weight", "recompute",
// "step", "aux")
// took [t0, t1): observed in the stage metrics and traced as its span kind.
void TimeCompute(StageContext& ctx, const char* phase, int64_t step, int micro_batch,
                 std::chrono::steady_clock::time_point t0,
                 std::chrono::steady_clock::time_point t1 = std::chrono::steady_clock::now());

// Bytes held by `t` (0 if undefined) and by every tensor of `ts`.
int64_t TensorBytes(const torch::Tensor& t);
int64_t TensorBytes(const std::vector<torch::Tensor>& ts);

// Sizes of `micro_batches` near-equal slices of a batch of `batch_size`
// samples (the first ones one larger when it does not divide).
std::vector<int64_t> MicroBatchSizes(int64_t batch_size, int micro_batches);

// INVALID_ARGUMENT "StageMessage.tensors['name']: shape ... does not match
// <what> ..." unless `got` has the shape `want`.
absl::Status CheckOutputShape(const std::string& name, c10::IntArrayRef got, c10::IntArrayRef want,
                              const char* what = "the stage output");

// Sets `lr` on `optimizer` and steps it.
void StepAt(torch::optim::Optimizer& optimizer, double lr);
// The stage's optimizer step at `lr` (and `extra`'s, e.g. an aux head's),
// timed as compute phase "step" of mini-batch `step` and counted in the
// stage metrics. On replicated stages the gradients are averaged among the
// stage's replicas first (StageContext::AverageReplicaGradients); its error
// (a lost or stuck replica) fails the step.
absl::Status StepOptimizer(StageContext& ctx, int64_t step, double lr,
                           torch::optim::Optimizer* extra = nullptr);

// Last stage: forward, loss and backward of mini-batch `step` (`in`) at once
// (the input gradient lands in in.x.grad() on stages > 0), timed as
// "forward" (traced as a forward and a backward span). Returns the loss.
double LossBackward(StageContext& ctx, int64_t step, const ForwardInput& in);

// Memory kind "inputs" = `bytes`; where `held` inputs exceed `*peak`, updates
// it and the summary's peak_inputs / peak_input_bytes and returns true.
bool ReportHeldInputs(StageContext& ctx, int64_t held, int64_t bytes, int64_t* peak);
// The staleness gauge = `stale`; the summary's staleness_steps keeps the
// largest (`*max`).
void ReportStaleness(StageContext& ctx, int64_t stale, int64_t* max);

// Mini-batch `step`: recomputes the stage's forward from `input` with BatchNorm running
// statistics frozen (timed "recompute"), checks that `grad` has the output's
// shape and backpropagates it (timed "backward").
absl::Status RecomputeBackward(StageContext& ctx, int64_t step, const torch::Tensor& input,
                               const torch::Tensor& grad);

// Moves an auxiliary module (aux head, AuxNet) to the stage's device in
// training mode, reports its size as summary `name` and memory kind `name`,
// and returns its own optimizer (the job's optimizer settings).
std::unique_ptr<torch::optim::Optimizer> SetUpAuxModule(StageContext& ctx,
                                                        torch::nn::Module& module,
                                                        const std::string& name);

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
// Encodes `tensor` as tensors[name]; float32 goes on the wire as
// `compression` says (the job's transport.compression: StageContext::Wire).
absl::Status PutTensor(v1::StageMessage* message, const std::string& name,
                       const torch::Tensor& tensor,
                       v1::Compression compression = v1::COMPRESSION_NONE);
// As above, with everything EncodeOptions says (StageContext::Wire: the
// compression and, towards a neighbour on this host, the shared ring).
absl::Status PutTensor(v1::StageMessage* message, const std::string& name,
                       const torch::Tensor& tensor, const EncodeOptions& options);
// Decodes tensors[name] onto `device`; INVALID_ARGUMENT naming the tensor if
// it is missing or malformed. The tensor takes the payload over without a copy
// (DecodeTensor(TensorProto*)): tensors[name] is left without data.
absl::StatusOr<torch::Tensor> GetTensor(v1::StageMessage& message, const std::string& name,
                                        torch::Device device);
// INVALID_ARGUMENT unless the message has this kind, step and micro-batch.
absl::Status ExpectMessage(const v1::StageMessage& message, v1::StageMessage::Kind kind,
                           int64_t step, int micro_batch);

// Sends `grad` to stage j-1 as BACKWARD `step`/`micro_batch`, with `x` too if
// it is defined and the loss it came from if `origin` >= 0; stage 0 sends
// nothing.
absl::Status SendGrad(StageContext& ctx, int64_t step, int micro_batch, const torch::Tensor& grad,
                      const torch::Tensor& x = torch::Tensor(), int64_t origin = -1);
// Receives BACKWARD `step`/`micro_batch` from stage j+1 and returns its
// "grad" (and its "x" in `*x` if `x` is given).
absl::StatusOr<torch::Tensor> ReceiveGrad(StageContext& ctx, int64_t step, int micro_batch,
                                          torch::Tensor* x = nullptr);

// Algorithm state in a checkpoint (Algorithm::SaveState writes it into the
// archive it is given; Run reads it back from ctx.resume_state()). Tensors
// are written detached and read back as copies on `device`; a missing or
// malformed entry is DATA_LOSS "resume state: ...".
//
// ResumeState: nullptr when the phase starts at its step 0 or resumes on
// another cut (ctx.resharded(): the algorithm restarts its pipeline at
// ctx.first_step()), else the state SaveState wrote at the checkpoint the job
// resumes from; FAILED_PRECONDITION naming `algorithm` when the phase resumes
// inside it without one.
absl::StatusOr<torch::serialize::InputArchive*> ResumeState(StageContext& ctx,
                                                            const std::string& algorithm);
void WriteStateInt(torch::serialize::OutputArchive& archive, const std::string& key, int64_t value);
void WriteStateTensor(torch::serialize::OutputArchive& archive, const std::string& key,
                      const torch::Tensor& tensor);
// `module`'s parameters and buffers, or `optimizer`'s state, as a nested archive.
void WriteStateModule(torch::serialize::OutputArchive& archive, const std::string& key,
                      const torch::nn::Module& module);
void WriteStateOptimizer(torch::serialize::OutputArchive& archive, const std::string& key,
                         const torch::optim::Optimizer& optimizer);
absl::StatusOr<int64_t> ReadStateInt(torch::serialize::InputArchive& archive,
                                     const std::string& key);
absl::StatusOr<torch::Tensor> ReadStateTensor(torch::serialize::InputArchive& archive,
                                              const std::string& key, torch::Device device);
absl::Status ReadStateModule(torch::serialize::InputArchive& archive, const std::string& key,
                             torch::nn::Module& module);
absl::Status ReadStateOptimizer(torch::serialize::InputArchive& archive, const std::string& key,
                                torch::optim::Optimizer& optimizer);

// An open accumulation window (petra's and delayed's `accumulation`): after
// `backwards` backward passes with a step every k, the gradient sums in the
// parameters' .grad are state when backwards % k != 0. WritePartialGrads
// records them (or that there are none); ReadPartialGrads checks the count
// and shapes and puts them back, DATA_LOSS naming `algorithm` otherwise.
// The end of an accumulation window of k backward passes: every parameter's
// gradient sum becomes its mean (nothing to do for k = 1).
void AverageWindowGrads(const std::vector<torch::Tensor>& params, int64_t k);
void WritePartialGrads(torch::serialize::OutputArchive& archive,
                       const std::vector<torch::Tensor>& params, bool open_window);
absl::Status ReadPartialGrads(torch::serialize::InputArchive& archive,
                              std::vector<torch::Tensor>& params, bool open_window,
                              torch::Device device, const std::string& algorithm);

// Forward-only pass over the test set through the real stages in eval mode:
// stage 0 sends EVAL batches, the last stage reports loss and accuracy. Every
// stage calls it at the same point of its schedule.
absl::Status RunEvaluation(StageContext& ctx, int64_t steps_done);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_COMMON_H_
