// delayed: delayed gradients without a flush (DDG, Huo et al. 2018; weight
// stashing as in PipeDream). ALGORITHMS.md, "delayed".
//
// Stage j keeps up to d_j = 2(J-1-j)+1 mini-batches in flight (capped by
// max_in_flight) and runs them in 1F1B order: d_j forwards, then one backward
// and one forward in turn, so its gradients are 2(J-1-j) steps stale. A
// forward runs without a graph and stores its input (and, with `stash`, the
// parameters it used); when the gradient returns the stage recomputes the
// forward from that input with the stashed (or current) parameters,
// backpropagates, applies the gradient to the current parameters and sends
// the input gradient down. The last stage does forward, loss, backward and
// step at once. BatchNorm running statistics are updated in the forward pass;
// the recomputation leaves them alone. The pipeline drains where an
// evaluation is due, so evaluation sees settled parameters.
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/training/optimizer.h"
#include "worker/algorithms/common.h"

namespace stagewise::worker {
namespace {

int64_t Bytes(const torch::Tensor& t) { return t.numel() * t.element_size(); }

class Delayed : public Algorithm {
 public:
  explicit Delayed(const AlgorithmSpec& spec)
      : stash_(spec.GetString("weights") == "stash"),
        max_in_flight_(spec.GetInt("max_in_flight")) {}

  absl::Status Run(StageContext& ctx) override {
    const int64_t J = ctx.num_stages(), j = ctx.stage();
    depth_ = 2 * (J - 1 - j) + 1;
    if (max_in_flight_ > 0) depth_ = std::min(depth_, max_in_flight_);
    params_ = ctx.model().parameters();
    const int64_t total = ctx.total_steps();
    for (int64_t begin = 0; begin < total;) {
      int64_t end = begin + 1;
      while (end < total && !ctx.EvalDue(end)) ++end;
      for (int64_t f = begin, b = begin; b < end;) {
        STAGEWISE_RETURN_IF_ERROR(ctx.Interrupted());
        if (f < end && f - b < depth_) {
          STAGEWISE_RETURN_IF_ERROR(Forward(ctx, f++));
        } else {
          STAGEWISE_RETURN_IF_ERROR(ctx.last() ? absl::OkStatus() : Backward(ctx, b));
          ++b;
        }
      }
      if (ctx.EvalDue(end)) STAGEWISE_RETURN_IF_ERROR(RunEvaluation(ctx, end));
      begin = end;
    }
    return absl::OkStatus();
  }

 private:
  struct InFlight {
    torch::Tensor input;
    std::vector<torch::Tensor> stash;  // parameters the forward used
    int64_t forward_step = 0;          // optimizer steps done at the forward
  };

  void Step(StageContext& ctx, double loss, int64_t samples) {
    const auto t0 = std::chrono::steady_clock::now();
    training::SetLearningRate(ctx.optimizer(), ctx.LearningRate(steps_));
    ctx.optimizer().step();
    ctx.stage_metrics().ObserveCompute("step", SecondsSince(t0));
    ctx.stage_metrics().IncSteps();
    ++steps_;
    ctx.ReportStep(steps_, loss, samples);
  }

  void ReportBuffers(StageContext& ctx) {
    int64_t inputs = 0, stashed = 0;
    for (const auto& [t, f] : inflight_) {
      inputs += Bytes(f.input);
      for (const auto& p : f.stash) stashed += Bytes(p);
    }
    ctx.stage_metrics().SetMemory("inputs", inputs);
    ctx.stage_metrics().SetMemory("stashed_parameters", stashed);
    const auto held = static_cast<int64_t>(inflight_.size());
    if (held > peak_inputs_) {
      peak_inputs_ = held;
      ctx.Summarize("peak_inputs", static_cast<double>(held));
      ctx.Summarize("peak_input_bytes", static_cast<double>(inputs));
      ctx.Summarize("peak_stashed_versions", stash_ ? static_cast<double>(held) : 0.0);
      ctx.Summarize("peak_stashed_parameter_bytes", static_cast<double>(stashed));
    }
  }

  absl::Status Forward(StageContext& ctx, int64_t t) {
    auto in = StageInput(ctx, t);
    if (!in.ok()) return in.status();
    torch::Tensor x = in->x, labels = in->labels;
    v1::TensorProto labels_proto = std::move(in->labels_proto);
    const auto t0 = std::chrono::steady_clock::now();
    if (ctx.last()) {
      // No delay on the last stage: forward, loss, backward and step at once.
      ctx.optimizer().zero_grad();
      if (!ctx.first()) x.requires_grad_(true);
      torch::Tensor loss = torch::cross_entropy_loss(ctx.model().forward(x), labels);
      loss.backward();
      ctx.stage_metrics().ObserveCompute("forward", SecondsSince(t0));
      ctx.stage_metrics().SetStaleness(0);
      Step(ctx, loss.item<double>(), labels.size(0));
      if (ctx.first()) return absl::OkStatus();
      v1::StageMessage back = NewMessage(v1::StageMessage::BACKWARD, t, 0);
      STAGEWISE_RETURN_IF_ERROR(PutTensor(&back, "grad", x.grad()));
      return ctx.SendToPrev(std::move(back));
    }
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = ctx.model().forward(x);  // running statistics are updated here, once
    }
    ctx.stage_metrics().ObserveCompute("forward", SecondsSince(t0));
    InFlight& f = inflight_[t];
    f.input = x;
    f.forward_step = steps_;
    if (stash_) {
      for (const auto& p : params_) f.stash.push_back(p.detach().clone());
    }
    ReportBuffers(ctx);
    return SendForward(ctx, t, 0, out, labels, std::move(labels_proto));
  }

  absl::Status Backward(StageContext& ctx, int64_t t) {
    auto msg = ctx.ReceiveFromNext();
    if (!msg.ok()) return msg.status();
    STAGEWISE_RETURN_IF_ERROR(ExpectMessage(*msg, v1::StageMessage::BACKWARD, t, 0));
    auto grad = GetTensor(*msg, "grad", ctx.device());
    if (!grad.ok()) return grad.status();
    auto it = inflight_.find(t);
    if (it == inflight_.end()) {
      return absl::InternalError(absl::StrCat("no stored input for mini-batch ", t));
    }
    InFlight f = std::move(it->second);
    inflight_.erase(it);
    ctx.optimizer().zero_grad();
    torch::Tensor x = ctx.first() ? f.input : f.input.requires_grad_(true);
    std::vector<torch::Tensor> current;
    if (stash_) {
      // The gradient is taken at the parameters the forward used and applied
      // to the current ones (weight stashing).
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) {
        current.push_back(params_[i].detach().clone());
        params_[i].copy_(f.stash[i]);
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor out;
    {
      models::FreezeRunningStats freeze;
      out = ctx.model().forward(x);
    }
    ctx.stage_metrics().ObserveCompute("recompute", SecondsSince(t0));
    if (!out.sizes().equals(grad->sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageMessage.tensors['grad']: shape ", c10::str(grad->sizes()),
                       " does not match the stage output ", c10::str(out.sizes())));
    }
    const auto t1 = std::chrono::steady_clock::now();
    out.backward(*grad);
    ctx.stage_metrics().ObserveCompute("backward", SecondsSince(t1));
    if (stash_) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(current[i]);
    }
    ctx.stage_metrics().SetStaleness(steps_ - f.forward_step);
    if (steps_ - f.forward_step > max_staleness_) {
      max_staleness_ = steps_ - f.forward_step;
      ctx.Summarize("staleness_steps", static_cast<double>(max_staleness_));
    }
    Step(ctx, 0.0, grad->size(0));
    ReportBuffers(ctx);
    if (ctx.first()) return absl::OkStatus();
    v1::StageMessage back = NewMessage(v1::StageMessage::BACKWARD, t, 0);
    STAGEWISE_RETURN_IF_ERROR(PutTensor(&back, "grad", x.grad()));
    return ctx.SendToPrev(std::move(back));
  }

  const bool stash_;
  const int64_t max_in_flight_;
  int64_t depth_ = 1;
  int64_t steps_ = 0;
  int64_t peak_inputs_ = 0;
  int64_t max_staleness_ = 0;
  std::vector<torch::Tensor> params_;
  std::map<int64_t, InFlight> inflight_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeDelayed(const AlgorithmSpec& spec) {
  return std::make_unique<Delayed>(spec);
}

}  // namespace stagewise::worker
