// backprop: exact synchronous backpropagation across stages (docs/algorithms.md).
// A mini-batch is split into M micro-batches that flow in the order of the
// schedule (services/planner/pipeline_schedule.h): GPipe (all forwards, then
// all backwards), 1F1B, or ZB-H1, where stages j > 0 split each backward into
// the input gradient (B, sent on at once) and the weight gradients (W,
// deferred into the bubbles; models::SplitPass), or interleaved 1F1B, where
// each worker holds stages.chunks_per_worker non-adjacent stages and runs
// the worker's order one operation at a time (worker/device_turns.h).
// Gradients are accumulated
// with loss scale n_m / B so the sum is the mini-batch mean, and every stage
// steps once per mini-batch, after its last backward or W. Stage 0 takes the
// next mini-batch only after its step (flush). With `recompute`, a stage keeps only each
// micro-batch's input and reruns the forward with a graph when the gradient returns. When the job
// assigns block modes (the planner, after Jiang et al., reversible
// training framework), the stage runs a ModalPass:
// storing blocks keep their graph, rebuilding reversible blocks keep nothing
// and rebuild their inputs from their outputs in the backward.
//
// Checkpoints: the cut is the mini-batch boundary. Every micro-batch's
// gradient came back before the step (GPipe, 1F1B, recompute and block modes
// alike) and gradients are zeroed at the start of each mini-batch, so there
// is no state besides the model and optimizer.
#include <chrono>
#include <vector>

#include "services/models/batch_norm.h"
#include "services/models/loss.h"
#include "services/models/modal_pass.h"
#include "services/models/split_pass.h"
#include "services/planner/pipeline_schedule.h"
#include "worker/algorithms/common.h"
#include "worker/algorithms/schedule.h"

namespace stagewise::worker {
namespace {

class Backprop : public Algorithm {
 public:
  explicit Backprop(const BackpropOptions& options)
      : micro_batches_(options.micro_batches),
        // auto was resolved to the planner's pick before (ResolveAutoSchedule).
        schedule_(options.schedule.value_or(PipelineSchedule::kOneFOneB)),
        recompute_(options.recompute),
        lookahead_(options.lookahead) {}

  // Nothing to save; checks that the cut has nothing in flight.
  absl::Status SaveState(StageContext&, torch::serialize::OutputArchive&) override {
    for (const auto& f : inflight_) {
      if (f.input.defined() || f.output.defined() || f.loss.defined() || f.pass ||
          !f.split.empty()) {
        return absl::FailedPreconditionError("backprop: checkpoint with a micro-batch in flight");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Run(StageContext& ctx) override {
    ctx.stage_metrics().SetStaleness(0);
    const int M = micro_batches_;
    // Interleaved: this stage is chunk c of worker j (virtual stage c J + j);
    // the schedule orders the worker's operations, of which this stage runs
    // those of its chunk, each at its position `turn` of the worker's order.
    const int v = schedule_ == PipelineSchedule::kInterleaved
                      ? std::max(1, ctx.spec().stages.chunks_per_worker)
                      : 1;
    const int J = ctx.num_stages() / v;
    if (J * v != ctx.num_stages()) {
      return absl::FailedPreconditionError(
          absl::StrCat("backprop: ", ctx.num_stages(),
                       " stages are not stages.chunks_per_worker = ", v, " chunks per worker"));
    }
    pipeline::ScheduleOptions options{
        .stages = J, .micro_batches = M, .lookahead = lookahead_, .chunks = v};
    auto orders = pipeline::StageOrders(schedule_, options);
    if (!orders.ok()) return orders.status();
    const std::vector<pipeline::Op>& worker_order = (*orders)[ctx.stage() % J];
    const int chunk = ctx.stage() / J;
    std::vector<pipeline::Op> order;
    std::vector<int> turn;  // the position of order[i] in the worker's order
    for (size_t i = 0; i < worker_order.size(); ++i) {
      if (worker_order[i].chunk != chunk) continue;
      order.push_back(worker_order[i]);
      turn.push_back(static_cast<int>(i));
    }
    const int turns = static_cast<int>(worker_order.size());
    DeviceTurns* device = v > 1 ? ctx.device_turns() : nullptr;
    split_ = false;
    for (const pipeline::Op& op : order)
      split_ = split_ || op.kind == pipeline::OpKind::kBackwardWeight;
    if (split_) {
      for (BlockMode mode : ctx.block_modes()) {
        if (mode == BlockMode::kRebuild) {
          return absl::FailedPreconditionError(
              "algorithm.schedule: zb-h1 splits each backward into B and W, which a block in "
              "rebuild mode (stages.modes) cannot: it keeps no graph between them");
        }
      }
    }
    return RunLockStep(ctx, [&](int64_t step) -> absl::Status {
      ctx.optimizer().zero_grad();
      inflight_.assign(M, InFlight{});
      loss_ = 0;
      if (ctx.first()) {
        data::Batch b = ctx.TrainBatch(step);
        batch_size_ = b.y.size(0);
        xs_ = b.x.split_with_sizes(MicroBatchSizes(batch_size_, M));
        ys_ = b.y.split_with_sizes(MicroBatchSizes(batch_size_, M));
      } else {
        batch_size_ = ctx.batch_size();
      }
      for (size_t i = 0; i < order.size(); ++i) {
        const pipeline::Op& op = order[i];
        if (device != nullptr) STAGEWISE_RETURN_IF_ERROR(device->Acquire(step, turn[i], turns));
        switch (op.kind) {
          case pipeline::OpKind::kForward:
            STAGEWISE_RETURN_IF_ERROR(Forward(ctx, step, op.micro_batch));
            break;
          case pipeline::OpKind::kBackward:
            STAGEWISE_RETURN_IF_ERROR(Backward(ctx, step, op.micro_batch));
            break;
          case pipeline::OpKind::kBackwardInput:
            STAGEWISE_RETURN_IF_ERROR(BackwardInput(ctx, step, op.micro_batch));
            break;
          case pipeline::OpKind::kBackwardWeight:
            BackwardWeight(ctx, step, op.micro_batch);
            break;
        }
        if (device != nullptr) STAGEWISE_RETURN_IF_ERROR(device->Release(step, turn[i], turns));
      }
      STAGEWISE_RETURN_IF_ERROR(StepOptimizer(ctx, step, ctx.LearningRate(step)));
      ctx.stage_metrics().SetMemory("activations", 0);
      ctx.ReportStep(step + 1, loss_, batch_size_);
      return absl::OkStatus();
    });
  }

 private:
  struct InFlight {
    torch::Tensor input;                      // leaf; requires grad on stages > 0
    torch::Tensor output;                     // with graph, unless recompute
    torch::Tensor loss;                       // last stage: scaled, with graph
    torch::Tensor logits;                     // last stage with block modes
    std::shared_ptr<models::ModalPass> pass;  // with block modes
    models::SplitPass split;                  // zb-h1: from the forward (or recompute) to W
  };

  // Micro-batches run their backwards (or W) in order: the last one's
  // completes the gradients, so replicated stages may start averaging them
  // during it.
  void ArmBeforeLastBackward(StageContext& ctx, int m) const {
    if (m == micro_batches_ - 1) ctx.ArmReplicaOverlap();
  }

  int64_t HeldBytes() const {
    int64_t bytes = 0;
    for (const auto& f : inflight_) bytes += TensorBytes(f.input) + TensorBytes(f.output);
    return bytes;
  }

  // The last stage's loss of micro-batch m, scaled so that the accumulated
  // gradient is the mini-batch mean.
  torch::Tensor ScaledLoss(const torch::Tensor& logits, const torch::Tensor& labels) {
    const double weight = static_cast<double>(labels.size(0)) / static_cast<double>(batch_size_);
    torch::Tensor loss = models::CrossEntropy(logits, labels) * weight;
    loss_ += loss.item<double>();
    return loss;
  }

  absl::Status Forward(StageContext& ctx, int64_t step, int m) {
    torch::Tensor input, labels;
    v1::TensorProto labels_proto;
    if (ctx.first()) {
      input = xs_[m].to(ctx.device());
      labels = ys_[m].to(ctx.device());
    } else {
      STAGEWISE_ASSIGN_OR_RETURN(ForwardInput in, ReceiveForward(ctx, step, m));
      input = in.x.requires_grad_(true);
      labels_proto = std::move(in.labels_proto);
      labels = in.labels;
    }
    const auto t0 = std::chrono::steady_clock::now();
    InFlight& f = inflight_[m];
    if (!ctx.block_modes().empty() && !split_) {
      return ModalForward(ctx, step, m, input, labels, std::move(labels_proto), t0);
    }
    f.input = input;
    torch::Tensor out;
    if (recompute_ && !ctx.last()) {
      // The recomputation updates BatchNorm running statistics; this pass must not.
      torch::NoGradGuard no_grad;
      models::FreezeRunningStats freeze;
      out = ctx.model().forward(input);
    } else if (split_) {
      f.split = models::SplitPass::Forward(ctx.model().blocks(), input);
      out = f.output = f.split.output();
    } else {
      out = f.output = ctx.model().forward(input);
    }
    if (ctx.last()) {
      f.loss = ScaledLoss(out, labels);  // the backward follows in the order
      TimeCompute(ctx, "forward", step, m, t0);
      return absl::OkStatus();
    }
    const torch::Tensor sent = ctx.PrepareSend(Side::kNext, out.detach());
    TimeCompute(ctx, "forward", step, m, t0);
    const int64_t held = HeldBytes();
    ctx.stage_metrics().SetMemory("activations", held);
    if (held > peak_held_) {
      peak_held_ = held;
      ctx.Summarize("peak_input_bytes", static_cast<double>(held));  // boundary tensors only
    }
    return SendForward(ctx, step, m, sent, labels, std::move(labels_proto));
  }

  // The fused backward of micro-batch m: input and weight gradients at once.
  absl::Status Backward(StageContext& ctx, int64_t step, int m) {
    InFlight& f = inflight_[m];
    if (ctx.last()) {
      const auto t0 = std::chrono::steady_clock::now();
      ArmBeforeLastBackward(ctx, m);
      f.loss.backward();
      torch::Tensor grad_in = f.pass ? f.pass->Backward(f.logits.grad()) : f.input.grad();
      grad_in = ctx.PrepareSend(Side::kPrev, grad_in);
      TimeCompute(ctx, "backward", step, m, t0);
      f = InFlight{};
      return SendGrad(ctx, step, m, grad_in);
    }
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor grad, ReceiveGrad(ctx, step, m));
    if (f.pass) {
      const auto t0 = std::chrono::steady_clock::now();
      ArmBeforeLastBackward(ctx, m);
      torch::Tensor grad_in = ctx.PrepareSend(Side::kPrev, f.pass->Backward(grad));
      TimeCompute(ctx, "backward", step, m, t0);
      f = InFlight{};
      return SendGrad(ctx, step, m, grad_in);
    }
    torch::Tensor out = f.output;
    if (recompute_) {
      const auto t0 = std::chrono::steady_clock::now();
      out = ctx.model().forward(f.input);
      TimeCompute(ctx, "recompute", step, m, t0);
    }
    STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("grad", grad.sizes(), out.sizes()));
    const auto t0 = std::chrono::steady_clock::now();
    ArmBeforeLastBackward(ctx, m);
    out.backward(grad);
    const torch::Tensor grad_in = ctx.PrepareSend(Side::kPrev, f.input.grad());
    TimeCompute(ctx, "backward", step, m, t0);
    STAGEWISE_RETURN_IF_ERROR(SendGrad(ctx, step, m, grad_in));
    f = InFlight{};
    ctx.stage_metrics().SetMemory("activations", HeldBytes());
    return absl::OkStatus();
  }

  // B of micro-batch m (zb-h1, stages > 0): the input gradient, sent at
  // once; the graph stays for W.
  absl::Status BackwardInput(StageContext& ctx, int64_t step, int m) {
    InFlight& f = inflight_[m];
    torch::Tensor root = f.loss, root_grad;
    if (!ctx.last()) {
      STAGEWISE_ASSIGN_OR_RETURN(root_grad, ReceiveGrad(ctx, step, m));
      if (recompute_) {
        const auto t0 = std::chrono::steady_clock::now();
        f.split = models::SplitPass::Forward(ctx.model().blocks(), f.input);
        f.output = f.split.output();
        TimeCompute(ctx, "recompute", step, m, t0);
      }
      root = f.split.output();
      STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("grad", root_grad.sizes(), root.sizes()));
    }
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor grad_in = ctx.PrepareSend(Side::kPrev, f.split.BackwardInput(root, root_grad));
    TimeCompute(ctx, "backward", step, m, t0);
    f.loss = torch::Tensor();
    return SendGrad(ctx, step, m, grad_in);
  }

  // W of micro-batch m (zb-h1): its weight gradients, from what B left.
  void BackwardWeight(StageContext& ctx, int64_t step, int m) {
    InFlight& f = inflight_[m];
    const auto t0 = std::chrono::steady_clock::now();
    ArmBeforeLastBackward(ctx, m);
    f.split.BackwardWeight();
    TimeCompute(ctx, "backward_weight", step, m, t0);
    f = InFlight{};
    ctx.stage_metrics().SetMemory("activations", HeldBytes());
  }

  // Forward through the stage's blocks in their assigned modes; the last
  // stage goes on with the loss (its backward follows in the order).
  absl::Status ModalForward(StageContext& ctx, int64_t step, int m, const torch::Tensor& input,
                            const torch::Tensor& labels, v1::TensorProto labels_proto,
                            std::chrono::steady_clock::time_point t0) {
    InFlight& f = inflight_[m];
    STAGEWISE_ASSIGN_OR_RETURN(auto pass,
                               models::ModalPass::Forward(ctx.model().blocks(), ctx.block_modes(),
                                                          input.detach(), !ctx.first()));
    f.pass = std::make_shared<models::ModalPass>(std::move(pass));
    if (!ctx.last()) {
      const torch::Tensor sent = ctx.PrepareSend(Side::kNext, f.pass->output().detach());
      TimeCompute(ctx, "forward", step, m, t0);
      return SendForward(ctx, step, m, sent, labels, std::move(labels_proto));
    }
    TimeCompute(ctx, "forward", step, m, t0);
    // The backward follows at once in the order; until then the stage input
    // stays with the micro-batch, as in one fused forward and backward (the
    // planner's memory model of the last stage).
    f.input = input;
    f.logits = f.pass->output().requires_grad_(true);
    f.loss = ScaledLoss(f.logits, labels);
    return absl::OkStatus();
  }

  const int micro_batches_;
  const PipelineSchedule schedule_;
  const bool recompute_;
  const int lookahead_;
  bool split_ = false;  // this stage's order has W operations (zb-h1, stages > 0)
  int64_t peak_held_ = 0;
  std::vector<InFlight> inflight_;
  std::vector<torch::Tensor> xs_, ys_;
  int64_t batch_size_ = 0;
  double loss_ = 0;
};

}  // namespace

std::unique_ptr<Algorithm> MakeBackprop(const BackpropOptions& options) {
  return std::make_unique<Backprop>(options);
}

}  // namespace stagewise::worker
