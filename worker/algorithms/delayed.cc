// delayed: delayed gradients without a flush (DDG, Huo et al. 2018; weight
// stashing as in PipeDream). docs/algorithms.md, "delayed".
//
// Stage j keeps up to d_j = 2(J-1-j)+1 mini-batches in flight (capped by
// max_in_flight; with max_in_flight: auto as many as the plan chose to cover
// the links' round trip, StagePlace::planned_in_flight) and runs them in
// 1F1B order: d_j forwards, then one backward and one forward in turn, so its
// gradients are d_j - 1 steps stale.
// With `forward: once` (the default with `weights: stash`, as the paper and
// PipeDream run it) a forward runs with a graph at a copy of the parameters
// (the stash, worker/algorithms/weight_version.h) and keeps the graph; when
// the gradient returns the stage backpropagates through it, applies the
// gradient to the current parameters and sends the input gradient down. With
// `forward: recompute` a forward runs without a graph and stores its input
// (and, with `stash`, the parameters it used); when the gradient returns the
// stage recomputes the forward from that input with the stashed (or current)
// parameters and backpropagates: one more forward per mini-batch, and only
// the input kept. Both give the same trajectory (the oracle). The last stage
// does forward, loss, backward and step at once. BatchNorm running
// statistics are updated in the forward pass; the recomputation leaves them
// alone. The pipeline drains where an
// evaluation or a checkpoint is due, so evaluation sees settled parameters.
//
// Staleness corrections (options; worker/algorithms/delay_corrections.h):
// with predict_weights (stash only), a forward runs at w + s (w - w_prev), the
// weights extrapolated along the last update by the stage's staleness
// s = d_j - 1, and stashes them, so the gradient is taken near the weights it
// will be applied to (SpecTrain-style weight prediction); lr_by_delay scales
// the stage's learning rate by 1/(1+s) or 1/sqrt(1+s) (staleness-aware
// rates); momentum_by_delay: compensate (SGD) steps at momentum
// max(0, m - s/(1+s)).
// Bounded accumulation (accumulation: k, as PACI): every stage sums the
// gradients of k backward passes and steps once with their mean, so the
// weights move k times slower than the pipeline's delay and a mini-batch's
// forward and backward are at most ceil(s/k) updates apart; the corrections
// above then take the staleness in updates, s/k. The update uses the learning
// rate of its window's first mini-batch.
//
// Checkpoints: the cut is a drain, so nothing is in flight there; the state
// besides the model and optimizer is the step count (= the cut's step on every
// stage), which a resumed run takes from ctx.first_step(), and with k > 1 the
// update count and an open window's gradient sums, and with predict_weights
// w_prev. SaveState records them. A resume on another cut
// (StageContext::resharded) reads none of it: it is exact up to the new cut's
// delays (stage j's staleness is the new J's from step s on) and its first
// forward predicts nothing (as the first of a job).
#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/algorithms/common.h"
#include "worker/algorithms/delay_corrections.h"
#include "worker/algorithms/schedule.h"
#include "worker/algorithms/weight_version.h"

namespace stagewise::worker {
namespace {

class Delayed : public Algorithm {
 public:
  explicit Delayed(const DelayedOptions& options)
      : stash_(options.weights == DelayedWeights::kStash),
        once_(options.forward_once()),
        max_in_flight_(options.max_in_flight),
        corrections_({.lr_by_delay = options.lr_by_delay,
                      .momentum_by_delay = options.momentum_by_delay,
                      .predict_weights = options.predict_weights}),
        k_(options.accumulation) {}

  // The cut is a drain: nothing in flight, the step count is the cut's step.
  absl::Status SaveState(StageContext&, torch::serialize::OutputArchive& archive) override {
    if (!inflight_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("delayed: checkpoint with ", inflight_.size(), " mini-batches in flight"));
    }
    WriteStateInt(archive, "steps", backwards_);
    if (k_ > 1) {
      WriteStateInt(archive, "updates", updates_);
      WritePartialGrads(archive, params_, backwards_ % k_ != 0);
    }
    corrections_.Save(archive);  // predict_weights: w_prev
    return absl::OkStatus();
  }

  absl::Status Run(StageContext& ctx) override {
    const int64_t J = ctx.num_stages(), j = ctx.stage();
    depth_ = 2 * (J - 1 - j) + 1;
    if (max_in_flight_ > 0) depth_ = std::min(depth_, max_in_flight_);
    // max_in_flight: auto: the plan's depth, deep enough to cover the links'
    // round trip (never below the natural one; the last stage keeps 1).
    if (max_in_flight_ == kAutoInFlight && ctx.place().planned_in_flight > 0 && !ctx.last()) {
      depth_ = std::max(depth_, static_cast<int64_t>(ctx.place().planned_in_flight));
    }
    params_ = ctx.model().parameters();
    backwards_ = ctx.first_step();
    updates_ = backwards_ / k_;
    ctx.optimizer().zero_grad();
    // The staleness in updates: s mini-batches cross s / k of them.
    corrections_.Start(ctx.last() ? 0.0 : static_cast<double>(depth_ - 1) / static_cast<double>(k_),
                       params_);
    STAGEWISE_ASSIGN_OR_RETURN(torch::serialize::InputArchive* const state,
                               ResumeState(ctx, "delayed"));
    if (state != nullptr) {
      STAGEWISE_ASSIGN_OR_RETURN(const int64_t saved, ReadStateInt(*state, "steps"));
      if (saved != backwards_) {
        return absl::DataLossError(absl::StrCat("resume state: delayed saved ", saved,
                                                " steps, the job resumes at step ", backwards_));
      }
      if (k_ > 1) {
        STAGEWISE_ASSIGN_OR_RETURN(const int64_t updates, ReadStateInt(*state, "updates"));
        if (updates != updates_) {
          return absl::DataLossError(absl::StrCat("resume state: delayed saved ", updates,
                                                  " updates, the job resumes at ", updates_,
                                                  " with accumulation ", k_));
        }
        STAGEWISE_RETURN_IF_ERROR(
            ReadPartialGrads(*state, params_, backwards_ % k_ != 0, ctx.device(), "delayed"));
      }
      STAGEWISE_RETURN_IF_ERROR(corrections_.Load(ctx, *state, "delayed"));
    }
    return RunDrainedPipeline(
        ctx, depth_, [&](int64_t t) { return Forward(ctx, t); },
        [&](int64_t t) { return Backward(ctx, t); });
  }

 private:
  struct InFlight {
    torch::Tensor input;
    std::vector<torch::Tensor> stash;  // recompute: parameters the forward used
    torch::Tensor output;              // once: the forward's output, its graph kept
    WeightVersion version;             // once: the parameters that graph holds
    int64_t forward_update = 0;        // optimizer steps done at the forward
  };

  // Mini-batch t's backward pass done: every k-th steps with the window's mean.
  absl::Status Accumulate(StageContext& ctx, int64_t t, double loss, int64_t samples) {
    ++backwards_;
    if (backwards_ % k_ == 0) STAGEWISE_RETURN_IF_ERROR(Step(ctx, t));
    ctx.ReportStep(backwards_, loss, samples);
    return absl::OkStatus();
  }

  absl::Status Step(StageContext& ctx, int64_t t) {
    AverageWindowGrads(params_, k_);
    STAGEWISE_RETURN_IF_ERROR(corrections_.Step(ctx, t, ctx.LearningRate(backwards_ - k_)));
    ctx.optimizer().zero_grad();
    ++updates_;
    return absl::OkStatus();
  }

  void ReportBuffers(StageContext& ctx) {
    int64_t inputs = 0, stashed = 0;
    for (const auto& [t, f] : inflight_) {
      inputs += TensorBytes(f.input);
      stashed += TensorBytes(f.stash) + f.version.bytes();
    }
    ctx.stage_metrics().SetMemory("stashed_parameters", stashed);
    const auto held = static_cast<int64_t>(inflight_.size());
    if (ReportHeldInputs(ctx, held, inputs, &peak_inputs_)) {
      ctx.Summarize("peak_stashed_versions", stash_ ? static_cast<double>(held) : 0.0);
      ctx.Summarize("peak_stashed_parameter_bytes", static_cast<double>(stashed));
    }
  }

  absl::Status Forward(StageContext& ctx, int64_t t) {
    STAGEWISE_ASSIGN_OR_RETURN(ForwardInput in, StageInput(ctx, t));
    if (ctx.last()) {
      // No delay on the last stage: forward, loss, backward and step at once.
      const double loss = LossBackward(ctx, t, in);
      ctx.stage_metrics().SetStaleness(0);
      STAGEWISE_RETURN_IF_ERROR(Accumulate(ctx, t, loss, in.labels.size(0)));
      return SendGrad(ctx, t, 0, in.x.grad());
    }
    if (once_) return ForwardOnce(ctx, t, std::move(in));
    const auto t0 = std::chrono::steady_clock::now();
    // predict_weights: w + s (w - w_prev) for this forward and its stash; w
    // comes back after.
    const std::vector<torch::Tensor> current = corrections_.Predict();
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = ctx.model().forward(in.x);  // running statistics are updated here, once
    }
    TimeCompute(ctx, "forward", t, 0, t0);
    InFlight& f = inflight_[t];
    f.input = in.x;
    f.forward_update = updates_;
    if (stash_) {
      for (const auto& p : params_) f.stash.push_back(p.detach().clone());
    }
    corrections_.Restore(current);
    ReportBuffers(ctx);
    return SendForward(ctx, t, 0, out, in.labels, std::move(in.labels_proto));
  }

  // forward: once. The forward runs with a graph at a copy of the weights
  // (predicted, with predict_weights), which the graph then holds.
  absl::Status ForwardOnce(StageContext& ctx, int64_t t, ForwardInput in) {
    const auto t0 = std::chrono::steady_clock::now();
    InFlight& f = inflight_[t];
    {
      const std::vector<torch::Tensor> current = corrections_.Predict();
      f.version = WeightVersion::Take(params_);
      corrections_.Restore(current);
    }
    f.input = ctx.first() ? in.x : in.x.requires_grad_(true);
    f.forward_update = updates_;
    {
      WeightVersion::InUse at(f.version, params_);
      f.output = ctx.model().forward(f.input);  // running statistics are updated here, once
    }
    TimeCompute(ctx, "forward", t, 0, t0);
    ReportBuffers(ctx);
    return SendForward(ctx, t, 0, f.output, in.labels, std::move(in.labels_proto));
  }

  absl::Status Backward(StageContext& ctx, int64_t t) {
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor grad, ReceiveGrad(ctx, t, 0));
    auto it = inflight_.find(t);
    if (it == inflight_.end()) {
      return absl::InternalError(absl::StrCat("no stored input for mini-batch ", t));
    }
    InFlight f = std::move(it->second);
    inflight_.erase(it);
    if (once_) {
      STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("grad", grad.sizes(), f.output.sizes()));
      const auto t0 = std::chrono::steady_clock::now();
      {
        // The gradient is taken at the weights the forward used (its
        // graph's) and applied to the current ones below.
        WeightVersion::InUse at(f.version, params_);
        f.output.backward(grad);
      }
      TimeCompute(ctx, "backward", t, 0, t0);
      f.output = torch::Tensor();  // the graph goes
      ReportStaleness(ctx, updates_ - f.forward_update, &max_staleness_);
      STAGEWISE_RETURN_IF_ERROR(Accumulate(ctx, t, 0.0, grad.size(0)));
      ReportBuffers(ctx);
      return SendGrad(ctx, t, 0, f.input.grad());  // nothing on the first stage
    }
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
    STAGEWISE_RETURN_IF_ERROR(RecomputeBackward(ctx, t, x, grad));
    if (stash_) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(current[i]);
    }
    ReportStaleness(ctx, updates_ - f.forward_update, &max_staleness_);
    STAGEWISE_RETURN_IF_ERROR(Accumulate(ctx, t, 0.0, grad.size(0)));
    ReportBuffers(ctx);
    return SendGrad(ctx, t, 0, x.grad());
  }

  const bool stash_;
  const bool once_;  // forward: once (resolved)
  const int64_t max_in_flight_;
  // In updates: s = (d_j - 1) / k (0 on the last stage).
  DelayCorrections corrections_;
  const int64_t k_;  // accumulation: a step every k backward passes
  int64_t depth_ = 1;
  int64_t backwards_ = 0;  // mini-batches whose backward is done (the job's step)
  int64_t updates_ = 0;    // optimizer steps
  int64_t peak_inputs_ = 0;
  int64_t max_staleness_ = 0;
  std::vector<torch::Tensor> params_;
  std::map<int64_t, InFlight> inflight_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeDelayed(const DelayedOptions& options) {
  return std::make_unique<Delayed>(options);
}

}  // namespace stagewise::worker
