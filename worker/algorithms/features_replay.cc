// features_replay: Features Replay (Huo, Gu and Huang, NeurIPS 2018; seed 003,
// Algorithm 1 and eq. (5)-(7)); ALGORITHMS.md, "features_replay".
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
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/training/optimizer.h"
#include "worker/algorithms/common.h"

namespace stagewise::worker {
namespace {

class FeaturesReplay : public Algorithm {
 public:
  explicit FeaturesReplay(const AlgorithmSpec&) {}

  absl::Status Run(StageContext& ctx) override {
    const int64_t J = ctx.num_stages(), j = ctx.stage();
    lag_ = J - 1 - j;
    ctx.Summarize("staleness_steps", static_cast<double>(lag_));
    for (int64_t t = 0; t < ctx.total_steps(); ++t) {
      STAGEWISE_RETURN_IF_ERROR(ctx.Interrupted());
      STAGEWISE_RETURN_IF_ERROR(Iteration(ctx, t));
      ctx.ReportStep(t + 1, loss_, samples_);
      if (ctx.EvalDue(t + 1)) STAGEWISE_RETURN_IF_ERROR(RunEvaluation(ctx, t + 1));
    }
    // Training stops at iteration T-1; the gradient stage j+1 sent during it
    // (for mini-batch T-(J-1-j)) would only be used at iteration T. It is
    // received and dropped, so no message outlives the phase.
    const int64_t T = ctx.total_steps();
    if (!ctx.last() && T >= lag_) {
      auto msg = ctx.ReceiveFromNext();
      if (!msg.ok()) return msg.status();
      STAGEWISE_RETURN_IF_ERROR(ExpectMessage(*msg, v1::StageMessage::BACKWARD, T - lag_, 0));
    }
    history_.clear();
    return absl::OkStatus();
  }

 private:
  void Step(StageContext& ctx, int64_t t) {
    const auto t0 = std::chrono::steady_clock::now();
    training::SetLearningRate(ctx.optimizer(), ctx.LearningRate(t));
    ctx.optimizer().step();
    ctx.stage_metrics().ObserveCompute("step", SecondsSince(t0));
    ctx.stage_metrics().IncSteps();
  }

  void ReportBuffers(StageContext& ctx) {
    int64_t bytes = 0;
    for (const auto& [t, x] : history_) bytes += x.numel() * x.element_size();
    ctx.stage_metrics().SetMemory("inputs", bytes);
    const auto held = static_cast<int64_t>(history_.size());
    if (held > peak_inputs_) {
      peak_inputs_ = held;
      ctx.Summarize("peak_inputs", static_cast<double>(held));
      ctx.Summarize("peak_input_bytes", static_cast<double>(bytes));
    }
  }

  absl::Status Iteration(StageContext& ctx, int64_t t) {
    // Forward of mini-batch t.
    auto in = StageInput(ctx, t);
    if (!in.ok()) return in.status();
    torch::Tensor x = in->x, labels = in->labels;
    v1::TensorProto labels_proto = std::move(in->labels_proto);
    const auto t0 = std::chrono::steady_clock::now();
    if (ctx.last()) {
      ctx.optimizer().zero_grad();
      if (!ctx.first()) x.requires_grad_(true);
      torch::Tensor loss = torch::cross_entropy_loss(ctx.model().forward(x), labels);
      loss.backward();
      ctx.stage_metrics().ObserveCompute("forward", SecondsSince(t0));
      loss_ = loss.item<double>();
      samples_ = labels.size(0);
      Step(ctx, t);
      if (ctx.first()) return absl::OkStatus();
      v1::StageMessage back = NewMessage(v1::StageMessage::BACKWARD, t, 0);
      STAGEWISE_RETURN_IF_ERROR(PutTensor(&back, "grad", x.grad()));
      return ctx.SendToPrev(std::move(back));
    }
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = ctx.model().forward(x);  // running statistics move here, once
    }
    ctx.stage_metrics().ObserveCompute("forward", SecondsSince(t0));
    history_[t] = x;
    samples_ = x.size(0);
    ReportBuffers(ctx);
    STAGEWISE_RETURN_IF_ERROR(SendForward(ctx, t, 0, out, labels, std::move(labels_proto)));

    // Replay of mini-batch t - (J-1-j) with the gradient of iteration t-1.
    const int64_t r = t - lag_;
    if (r < 0) return absl::OkStatus();  // warm-up: no gradient yet
    auto msg = ctx.ReceiveFromNext();
    if (!msg.ok()) return msg.status();
    STAGEWISE_RETURN_IF_ERROR(ExpectMessage(*msg, v1::StageMessage::BACKWARD, r, 0));
    auto grad = GetTensor(*msg, "grad", ctx.device());
    if (!grad.ok()) return grad.status();
    auto it = history_.find(r);
    if (it == history_.end()) {
      return absl::InternalError(absl::StrCat("no stored input for mini-batch ", r));
    }
    torch::Tensor input = it->second;
    history_.erase(it);
    ctx.optimizer().zero_grad();
    if (!ctx.first()) input = input.detach().requires_grad_(true);
    const auto t1 = std::chrono::steady_clock::now();
    torch::Tensor replay;
    {
      models::FreezeRunningStats freeze;
      replay = ctx.model().forward(input);
    }
    ctx.stage_metrics().ObserveCompute("recompute", SecondsSince(t1));
    if (!replay.sizes().equals(grad->sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageMessage.tensors['grad']: shape ", c10::str(grad->sizes()),
                       " does not match the stage output ", c10::str(replay.sizes())));
    }
    const auto t2 = std::chrono::steady_clock::now();
    replay.backward(*grad);
    ctx.stage_metrics().ObserveCompute("backward", SecondsSince(t2));
    ctx.stage_metrics().SetStaleness(lag_);
    Step(ctx, t);
    ReportBuffers(ctx);
    if (ctx.first()) return absl::OkStatus();
    v1::StageMessage back = NewMessage(v1::StageMessage::BACKWARD, r, 0);
    STAGEWISE_RETURN_IF_ERROR(PutTensor(&back, "grad", input.grad()));
    return ctx.SendToPrev(std::move(back));
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
