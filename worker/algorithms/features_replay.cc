// features_replay: "Training Neural Networks Using Features Replay" (Huo, Gu
// and Huang, NeurIPS 2018; Algorithm 1 and eq. (5)-(7)); docs/algorithms.md,
// "features_replay".
//
// Lock-step iterations t = 0, 1, ...: at iteration t every stage forwards
// mini-batch t (the forward stays sequential across stages) and keeps its
// input, J-j of them at stage j. In the same iteration stage j replays the
// input of mini-batch t-(J-1-j) through its blocks with its *current*
// parameters, backpropagates the gradient stage j+1 sent for that mini-batch
// during iteration t-1, steps, and sends its input gradient down, for
// iteration t+1 of stage j-1. The last stage backpropagates its fresh loss.
// A stage with no gradient yet (t < J-1-j) only forwards (warm-up).
//
// Staleness at stage j: J-1-j steps. BatchNorm running statistics move in the
// forward pass (once per sample); the replay freezes them. The gradients of
// the last J-1-j mini-batches never reach stage j (as in the paper, training
// stops at iteration T-1).
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/algorithms/common.h"
#include "worker/algorithms/schedule.h"

namespace stagewise::worker {
namespace {

class FeaturesReplay : public Algorithm {
 public:
  explicit FeaturesReplay(const AlgorithmSpec&) {}

  absl::Status Run(StageContext& ctx) override {
    const int64_t J = ctx.num_stages(), j = ctx.stage();
    lag_ = J - 1 - j;
    ctx.Summarize("staleness_steps", static_cast<double>(lag_));
    STAGEWISE_RETURN_IF_ERROR(RunLockStep(ctx, [&](int64_t t) -> absl::Status {
      STAGEWISE_RETURN_IF_ERROR(Iteration(ctx, t));
      ctx.ReportStep(t + 1, loss_, samples_);
      return absl::OkStatus();
    }));
    // Training stops at iteration T-1; the gradient stage j+1 sent during it
    // (for mini-batch T-(J-1-j)) would only be used at iteration T. It is
    // received and dropped, so no message outlives the phase.
    const int64_t T = ctx.total_steps();
    if (!ctx.last() && T >= lag_) {
      STAGEWISE_ASSIGN_OR_RETURN(v1::StageMessage msg, ctx.ReceiveFromNext());
      STAGEWISE_RETURN_IF_ERROR(ExpectMessage(msg, v1::StageMessage::BACKWARD, T - lag_, 0));
    }
    history_.clear();
    return absl::OkStatus();
  }

 private:
  void ReportBuffers(StageContext& ctx) {
    int64_t bytes = 0;
    for (const auto& [t, x] : history_) bytes += TensorBytes(x);
    ReportHeldInputs(ctx, static_cast<int64_t>(history_.size()), bytes, &peak_inputs_);
  }

  absl::Status Iteration(StageContext& ctx, int64_t t) {
    // Forward of mini-batch t.
    STAGEWISE_ASSIGN_OR_RETURN(ForwardInput in, StageInput(ctx, t));
    if (ctx.last()) {
      ctx.optimizer().zero_grad();
      loss_ = LossBackward(ctx, in);
      samples_ = in.labels.size(0);
      StepOptimizer(ctx, ctx.LearningRate(t));
      return SendGrad(ctx, t, 0, in.x.grad());
    }
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = ctx.model().forward(in.x);  // running statistics move here, once
    }
    ctx.stage_metrics().ObserveCompute("forward", SecondsSince(t0));
    history_[t] = in.x;
    samples_ = in.x.size(0);
    ReportBuffers(ctx);
    STAGEWISE_RETURN_IF_ERROR(SendForward(ctx, t, 0, out, in.labels, std::move(in.labels_proto)));

    // Replay of mini-batch t - (J-1-j) with the gradient of iteration t-1.
    const int64_t r = t - lag_;
    if (r < 0) return absl::OkStatus();  // warm-up: no gradient yet
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor grad, ReceiveGrad(ctx, r, 0));
    auto it = history_.find(r);
    if (it == history_.end()) {
      return absl::InternalError(absl::StrCat("no stored input for mini-batch ", r));
    }
    torch::Tensor input = it->second;
    history_.erase(it);
    ctx.optimizer().zero_grad();
    if (!ctx.first()) input = input.detach().requires_grad_(true);
    STAGEWISE_RETURN_IF_ERROR(RecomputeBackward(ctx, input, grad));  // the replay
    ctx.stage_metrics().SetStaleness(lag_);
    StepOptimizer(ctx, ctx.LearningRate(t));
    ReportBuffers(ctx);
    return SendGrad(ctx, r, 0, input.grad());
  }

  int64_t lag_ = 0;  // J-1-j
  int64_t peak_inputs_ = 0;
  double loss_ = 0;
  int64_t samples_ = 0;
  std::map<int64_t, torch::Tensor> history_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeFeaturesReplay(const AlgorithmSpec& spec) {
  return std::make_unique<FeaturesReplay>(spec);
}

}  // namespace stagewise::worker
