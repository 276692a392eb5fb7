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
//
// Checkpoints: the cut after iteration t is not drained (a drain would drop
// gradients). Stage j's state there, besides model and optimizer, is its
// stored inputs (mini-batches t-J+2+j .. t) and the gradient for mini-batch
// t+1-(J-1-j) that stage j+1 sent during iteration t. Where a checkpoint is
// due after iteration t, the stage receives that gradient at the end of the
// iteration (before the checkpoint) instead of at the start of iteration
// t+1; SaveState writes both, and a resumed run starts from them. A resume
// on another cut (StageContext::resharded) has neither, the inputs being
// another boundary's: the replay restarts at the resume step s as at a phase
// start (warm-up until s + J-1-j), so the mini-batches the old cut had not
// replayed yet never reach the stages below the last one.
#include <algorithm>
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/algorithms/common.h"
#include "worker/algorithms/schedule.h"

namespace stagewise::worker {
namespace {

class FeaturesReplay : public Algorithm {
 public:
  explicit FeaturesReplay(const FeaturesReplayOptions&) {}

  absl::Status Run(StageContext& ctx) override {
    const int64_t J = ctx.num_stages(), j = ctx.stage();
    lag_ = J - 1 - j;
    // On another cut than the checkpoint's the replay restarts at the resume
    // step: mini-batches before it are not replayed below the last stage.
    origin_ = ctx.resharded() ? ctx.first_step() : 0;
    ctx.Summarize("staleness_steps", static_cast<double>(lag_));
    STAGEWISE_ASSIGN_OR_RETURN(torch::serialize::InputArchive* const state,
                               ResumeState(ctx, "features_replay"));
    if (state != nullptr) {
      STAGEWISE_RETURN_IF_ERROR(Restore(ctx, *state));
    }
    STAGEWISE_RETURN_IF_ERROR(RunLockStep(ctx, [&](int64_t t) -> absl::Status {
      STAGEWISE_RETURN_IF_ERROR(Iteration(ctx, t));
      ctx.ReportStep(t + 1, loss_, samples_);
      // A checkpoint follows: the gradient stage j+1 sent during iteration t
      // (for mini-batch t+1-lag, used in iteration t+1) is taken now, so the
      // cut has no message in flight towards this stage.
      if (ctx.CheckpointDue(t + 1) && ExpectsGrad(ctx, t + 1)) {
        STAGEWISE_ASSIGN_OR_RETURN(pending_, ReceiveGrad(ctx, t + 1 - lag_, 0));
        pending_step_ = t + 1 - lag_;
      }
      return absl::OkStatus();
    }));
    // Training stops at iteration T-1; the gradient stage j+1 sent during it
    // (for mini-batch T-(J-1-j)) would only be used at iteration T. It is
    // received and dropped, so no message outlives the phase.
    const int64_t T = ctx.total_steps();
    if (ExpectsGrad(ctx, T)) {
      if (pending_step_ == T - lag_) {
        ClearPending();  // already taken (never at the phase end: no checkpoint there)
      } else {
        STAGEWISE_ASSIGN_OR_RETURN(v1::StageMessage msg, ctx.ReceiveFromNext());
        STAGEWISE_RETURN_IF_ERROR(ExpectMessage(msg, v1::StageMessage::BACKWARD, T - lag_, 0));
      }
    }
    if (pending_.defined()) {
      return absl::InternalError(
          absl::StrCat("a gradient for mini-batch ", pending_step_, " was never used"));
    }
    history_.clear();
    return absl::OkStatus();
  }

  // The stored inputs and the gradient taken ahead of the next iteration.
  absl::Status SaveState(StageContext&, torch::serialize::OutputArchive& archive) override {
    WriteStateInt(archive, "lag", lag_);
    WriteStateInt(archive, "history", static_cast<int64_t>(history_.size()));
    int64_t i = 0;
    for (const auto& [step, x] : history_) {
      WriteStateInt(archive, absl::StrCat("history_step_", i), step);
      WriteStateTensor(archive, absl::StrCat("history_", i), x);
      ++i;
    }
    WriteStateInt(archive, "pending_step", pending_.defined() ? pending_step_ : -1);
    if (pending_.defined()) WriteStateTensor(archive, "pending", pending_);
    return absl::OkStatus();
  }

 private:
  void ReportBuffers(StageContext& ctx) {
    int64_t bytes = 0;
    for (const auto& [t, x] : history_) bytes += TensorBytes(x);
    ReportHeldInputs(ctx, static_cast<int64_t>(history_.size()), bytes, &peak_inputs_);
  }

  // Whether stage j receives a gradient in iteration t (for mini-batch
  // t - lag): stage j+1 sent it during iteration t-1.
  bool ExpectsGrad(const StageContext& ctx, int64_t t) const {
    return !ctx.last() && t - lag_ >= origin_;
  }

  void ClearPending() {
    pending_ = torch::Tensor();
    pending_step_ = -1;
  }

  // A resumed run at step s (after iteration s-1): the inputs of mini-batches
  // max(0, s-lag) .. s-1 and, where iteration s replays one, its gradient.
  absl::Status Restore(StageContext& ctx, torch::serialize::InputArchive& state) {
    const int64_t s = ctx.first_step();
    STAGEWISE_ASSIGN_OR_RETURN(const int64_t lag, ReadStateInt(state, "lag"));
    if (lag != lag_) {
      return absl::DataLossError(absl::StrCat("resume state: features_replay saved lag ", lag,
                                              ", this stage has lag ", lag_));
    }
    STAGEWISE_ASSIGN_OR_RETURN(const int64_t count, ReadStateInt(state, "history"));
    history_.clear();
    for (int64_t i = 0; i < count; ++i) {
      STAGEWISE_ASSIGN_OR_RETURN(const int64_t step,
                                 ReadStateInt(state, absl::StrCat("history_step_", i)));
      STAGEWISE_ASSIGN_OR_RETURN(history_[step],
                                 ReadStateTensor(state, absl::StrCat("history_", i), ctx.device()));
    }
    const int64_t from = ctx.last() ? s : std::max<int64_t>(0, s - lag_);
    bool complete = static_cast<int64_t>(history_.size()) == s - from;
    for (int64_t r = from; complete && r < s; ++r) complete = history_.count(r) > 0;
    if (!complete) {
      return absl::DataLossError(absl::StrCat(
          "resume state: features_replay at step ", s, " needs the inputs of mini-batches ", from,
          " to ", s - 1, ", got ", history_.size(), " inputs that do not match"));
    }
    STAGEWISE_ASSIGN_OR_RETURN(pending_step_, ReadStateInt(state, "pending_step"));
    const int64_t want = ExpectsGrad(ctx, s) ? s - lag_ : -1;
    if (pending_step_ != want) {
      return absl::DataLossError(absl::StrCat("resume state: features_replay at step ", s,
                                              " needs the gradient of mini-batch ", want,
                                              " (-1: none), got ", pending_step_));
    }
    if (want >= 0) {
      STAGEWISE_ASSIGN_OR_RETURN(pending_, ReadStateTensor(state, "pending", ctx.device()));
    }
    return absl::OkStatus();
  }

  absl::Status Iteration(StageContext& ctx, int64_t t) {
    // Forward of mini-batch t.
    STAGEWISE_ASSIGN_OR_RETURN(ForwardInput in, StageInput(ctx, t));
    if (ctx.last()) {
      ctx.optimizer().zero_grad();
      loss_ = LossBackward(ctx, t, in);
      samples_ = in.labels.size(0);
      STAGEWISE_RETURN_IF_ERROR(StepOptimizer(ctx, t, ctx.LearningRate(t)));
      return SendGrad(ctx, t, 0, in.x.grad());
    }
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = ctx.model().forward(in.x);  // running statistics move here, once
    }
    TimeCompute(ctx, "forward", t, 0, t0);
    history_[t] = in.x;
    samples_ = in.x.size(0);
    ReportBuffers(ctx);
    STAGEWISE_RETURN_IF_ERROR(SendForward(ctx, t, 0, out, in.labels, std::move(in.labels_proto)));

    // Replay of mini-batch t - (J-1-j) with the gradient of iteration t-1.
    const int64_t r = t - lag_;
    if (r < origin_) return absl::OkStatus();  // warm-up: no gradient yet
    torch::Tensor grad;
    if (pending_.defined()) {
      if (pending_step_ != r) {
        return absl::InternalError(absl::StrCat("the gradient taken ahead is for mini-batch ",
                                                pending_step_, ", iteration ", t, " replays ", r));
      }
      grad = pending_;
      ClearPending();
    } else {
      STAGEWISE_ASSIGN_OR_RETURN(grad, ReceiveGrad(ctx, r, 0));
    }
    auto it = history_.find(r);
    if (it == history_.end()) {
      return absl::InternalError(absl::StrCat("no stored input for mini-batch ", r));
    }
    torch::Tensor input = it->second;
    history_.erase(it);
    ctx.optimizer().zero_grad();
    if (!ctx.first()) input = input.detach().requires_grad_(true);
    STAGEWISE_RETURN_IF_ERROR(RecomputeBackward(ctx, r, input, grad));  // the replay
    ctx.stage_metrics().SetStaleness(lag_);
    STAGEWISE_RETURN_IF_ERROR(StepOptimizer(ctx, t, ctx.LearningRate(t)));
    ReportBuffers(ctx);
    return SendGrad(ctx, r, 0, input.grad());
  }

  int64_t lag_ = 0;     // J-1-j
  int64_t origin_ = 0;  // the first mini-batch replayed: 0, or the resume step on another cut
  int64_t peak_inputs_ = 0;
  double loss_ = 0;
  int64_t samples_ = 0;
  std::map<int64_t, torch::Tensor> history_;
  // The gradient for mini-batch pending_step_, received at the end of the
  // iteration before a checkpoint (or restored from one).
  torch::Tensor pending_;
  int64_t pending_step_ = -1;
};

}  // namespace

std::unique_ptr<Algorithm> MakeFeaturesReplay(const FeaturesReplayOptions& options) {
  return std::make_unique<FeaturesReplay>(options);
}

}  // namespace stagewise::worker
