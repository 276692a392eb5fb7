// backprop: exact synchronous backpropagation across stages (docs/algorithms.md).
// A mini-batch is split into M micro-batches that flow forward in GPipe order
// (all forwards, then all backwards) or 1F1B order; gradients are accumulated
// with loss scale n_m / B so the sum is the mini-batch mean, and every stage
// steps once per mini-batch. Stage 0 takes the next mini-batch only after its
// step (flush). With `recompute`, a stage keeps only each micro-batch's input
// and reruns the forward with a graph when the gradient returns. When the job
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
#include "worker/algorithms/common.h"
#include "worker/algorithms/schedule.h"

namespace stagewise::worker {
namespace {

class Backprop : public Algorithm {
 public:
  explicit Backprop(const BackpropOptions& options)
      : micro_batches_(options.micro_batches),
        one_f_one_b_(options.schedule == PipelineSchedule::kOneFOneB),
        recompute_(options.recompute),
        lookahead_(options.lookahead) {}

  // Nothing to save; checks that the cut has nothing in flight.
  absl::Status SaveState(StageContext&, torch::serialize::OutputArchive&) override {
    for (const auto& f : inflight_) {
      if (f.input.defined() || f.output.defined() || f.pass) {
        return absl::FailedPreconditionError("backprop: checkpoint with a micro-batch in flight");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Run(StageContext& ctx) override {
    ctx.stage_metrics().SetStaleness(0);
    const int M = micro_batches_;
    // 1F1B: J-1-j forwards before the first backward, plus `lookahead` more
    // (the next micro-batch already queued while a message is on the wire).
    const int warm = ctx.last() ? 0 : std::min(ctx.num_stages() - 1 - ctx.stage() + lookahead_, M);
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
      if (one_f_one_b_) {
        for (int i = 0; i < warm; ++i) STAGEWISE_RETURN_IF_ERROR(Forward(ctx, step, i));
        for (int i = warm; i < M; ++i) {
          STAGEWISE_RETURN_IF_ERROR(Forward(ctx, step, i));
          if (!ctx.last()) STAGEWISE_RETURN_IF_ERROR(Backward(ctx, step, i - warm));
        }
        for (int i = M - warm; i < M; ++i) STAGEWISE_RETURN_IF_ERROR(Backward(ctx, step, i));
      } else {
        for (int i = 0; i < M; ++i) STAGEWISE_RETURN_IF_ERROR(Forward(ctx, step, i));
        if (!ctx.last()) {
          for (int i = 0; i < M; ++i) STAGEWISE_RETURN_IF_ERROR(Backward(ctx, step, i));
        }
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
    std::shared_ptr<models::ModalPass> pass;  // with block modes
  };

  // Micro-batches run their backwards in order: the last one's completes the
  // gradients, so replicated stages may start averaging them during it.
  void ArmBeforeLastBackward(StageContext& ctx, int m) const {
    if (m == micro_batches_ - 1) ctx.ArmReplicaOverlap();
  }

  int64_t HeldBytes() const {
    int64_t bytes = 0;
    for (const auto& f : inflight_) bytes += TensorBytes(f.input) + TensorBytes(f.output);
    return bytes;
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
    if (!ctx.block_modes().empty()) {
      return ModalForward(ctx, step, m, input, labels, std::move(labels_proto), t0);
    }
    f.input = input;
    if (ctx.last()) {
      // Forward, loss and backward at once; the loss is scaled so that the
      // accumulated gradient is the mini-batch mean.
      torch::Tensor logits = ctx.model().forward(input);
      const double weight = static_cast<double>(labels.size(0)) / static_cast<double>(batch_size_);
      torch::Tensor loss = models::CrossEntropy(logits, labels) * weight;
      TimeCompute(ctx, "forward", step, m, t0);
      const auto t1 = std::chrono::steady_clock::now();
      ArmBeforeLastBackward(ctx, m);
      loss.backward();
      TimeCompute(ctx, "backward", step, m, t1);
      loss_ += loss.item<double>();
      STAGEWISE_RETURN_IF_ERROR(SendGrad(ctx, step, m, input.grad()));
      f = InFlight{};
      return absl::OkStatus();
    }
    torch::Tensor out;
    if (recompute_) {
      // The recomputation updates BatchNorm running statistics; this pass must not.
      torch::NoGradGuard no_grad;
      models::FreezeRunningStats freeze;
      out = ctx.model().forward(input);
    } else {
      out = ctx.model().forward(input);
      f.output = out;
    }
    TimeCompute(ctx, "forward", step, m, t0);
    const int64_t held = HeldBytes();
    ctx.stage_metrics().SetMemory("activations", held);
    if (held > peak_held_) {
      peak_held_ = held;
      ctx.Summarize("peak_input_bytes", static_cast<double>(held));  // boundary tensors only
    }
    return SendForward(ctx, step, m, out, labels, std::move(labels_proto));
  }

  absl::Status Backward(StageContext& ctx, int64_t step, int m) {
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor grad, ReceiveGrad(ctx, step, m));
    InFlight& f = inflight_[m];
    if (f.pass) {
      const auto t0 = std::chrono::steady_clock::now();
      ArmBeforeLastBackward(ctx, m);
      torch::Tensor grad_in = f.pass->Backward(grad);
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
    TimeCompute(ctx, "backward", step, m, t0);
    STAGEWISE_RETURN_IF_ERROR(SendGrad(ctx, step, m, f.input.grad()));
    f = InFlight{};
    ctx.stage_metrics().SetMemory("activations", HeldBytes());
    return absl::OkStatus();
  }

  // Forward through the stage's blocks in their assigned modes; the last
  // stage goes on with the loss and the backward at once.
  absl::Status ModalForward(StageContext& ctx, int64_t step, int m, const torch::Tensor& input,
                            const torch::Tensor& labels, v1::TensorProto labels_proto,
                            std::chrono::steady_clock::time_point t0) {
    InFlight& f = inflight_[m];
    STAGEWISE_ASSIGN_OR_RETURN(auto pass,
                               models::ModalPass::Forward(ctx.model().blocks(), ctx.block_modes(),
                                                          input.detach(), !ctx.first()));
    f.pass = std::make_shared<models::ModalPass>(std::move(pass));
    TimeCompute(ctx, "forward", step, m, t0);
    if (!ctx.last()) {
      return SendForward(ctx, step, m, f.pass->output(), labels, std::move(labels_proto));
    }
    const auto t1 = std::chrono::steady_clock::now();
    torch::Tensor logits = f.pass->output().requires_grad_(true);
    const double weight = static_cast<double>(labels.size(0)) / static_cast<double>(batch_size_);
    torch::Tensor loss = models::CrossEntropy(logits, labels) * weight;
    ArmBeforeLastBackward(ctx, m);
    loss.backward();
    loss_ += loss.item<double>();
    torch::Tensor grad_in = f.pass->Backward(logits.grad());
    TimeCompute(ctx, "backward", step, m, t1);
    f = InFlight{};
    return SendGrad(ctx, step, m, grad_in);
  }

  const int micro_batches_;
  const bool one_f_one_b_;
  const bool recompute_;
  const int lookahead_;
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
