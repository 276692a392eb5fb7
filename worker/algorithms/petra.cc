// petra: "PETRA: Parallel End-to-end Training with Reversible Architectures"
// (Algorithm 1 and eq. (4)-(5)); docs/algorithms.md, "petra".
//
// Stage j < J-1 forwards every mini-batch as soon as it arrives, without a
// graph and with BatchNorm running statistics frozen, and keeps the inputs of
// its non-reversible blocks only (a FIFO). The backward message from stage
// j+1 carries the rebuilt activation x~_j and the gradient delta_{j+1}. Going
// from the last block to the first, a reversible block rebuilds its input from
// its output with the *current* parameters while keeping the graph of F on
// the rebuilt stream, and takes the vector-Jacobian product in the same go;
// a non-reversible block pops its stored input, recomputes and takes the VJP.
// That single recomputation is where running statistics move. Parameter
// gradients accumulate over k backward passes and are averaged; the stage
// steps every k-th one. It sends (x~_{j-1}, delta_j) down; stage 0 sends
// nothing. The last stage does forward, loss and backward at once and sends
// back its input with the gradient. No parameter copies anywhere (but w_prev
// with predict_weights, below).
//
// The schedule is delayed's: 2(J-1-j)+1 mini-batches in flight at stage j in
// 1F1B order, drained where an evaluation or a checkpoint is due.
//
// Staleness corrections (options, as delayed's; worker/algorithms/
// delay_corrections.h), with the stage's staleness s = 2(J-1-j) / k updates:
// lr_by_delay and momentum_by_delay change the stage's step; predict_weights
// runs the forward at w + s (w - w_prev), the weights the backward will
// rebuild with if the next s updates repeat the last one, so the rebuild
// inverts (nearly) the function the forward applied. It costs one copy of
// the parameters (w_prev, memory kind previous_parameters), the only one
// PETRA then holds.
//
// Checkpoints: at the drain nothing is in flight; backward passes and updates
// done follow from the cut's step s (s and s / k on every stage). When s is
// not a multiple of k, the gradients of the s mod k backward passes of the
// open window sit in the parameters' .grad: SaveState writes them and a
// resumed run puts them back, so the window completes as it would have. A
// resume on another cut (StageContext::resharded) drops them: that window's
// update sums only its remaining passes (still divided by k); nothing is
// dropped when checkpoint.every_steps is a multiple of k. With
// predict_weights, w_prev is state too (not read on another cut: the first
// forward there predicts nothing).
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/models/blocks.h"
#include "services/models/modal_pass.h"
#include "worker/algorithms/common.h"
#include "worker/algorithms/delay_corrections.h"
#include "worker/algorithms/schedule.h"

namespace stagewise::worker {
namespace {

class Petra : public Algorithm {
 public:
  explicit Petra(const PetraOptions& options)
      : k_(options.accumulation),
        verify_(options.verify_rebuild),
        corrections_({.lr_by_delay = options.lr_by_delay,
                      .momentum_by_delay = options.momentum_by_delay,
                      .predict_weights = options.predict_weights}) {}

  // The cut is a drain: nothing in flight; the open accumulation window's
  // gradient sums (if any) are the state.
  absl::Status SaveState(StageContext& ctx, torch::serialize::OutputArchive& archive) override {
    if (!inflight_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("petra: checkpoint with ", inflight_.size(), " mini-batches in flight"));
    }
    WriteStateInt(archive, "backwards", backwards_);
    WriteStateInt(archive, "updates", updates_);
    WritePartialGrads(archive, ctx.model().parameters(), backwards_ % k_ != 0);
    corrections_.Save(archive);  // predict_weights: w_prev
    return absl::OkStatus();
  }

  absl::Status Run(StageContext& ctx) override {
    const int64_t J = ctx.num_stages(), j = ctx.stage();
    depth_ = 2 * (J - 1 - j) + 1;
    blocks_ = ctx.model().blocks();
    ctx.optimizer().zero_grad();
    int64_t reversible = 0;
    for (const auto& b : blocks_) reversible += b->reversible() ? 1 : 0;
    ctx.Summarize("reversible_blocks", static_cast<double>(reversible));
    ctx.Summarize("peak_inputs", 0);
    ctx.Summarize("peak_input_bytes", 0);
    ctx.Summarize("peak_stashed_parameter_bytes", 0);  // PETRA stashes no parameters
    backwards_ = ctx.first_step();
    updates_ = backwards_ / k_;
    corrections_.Start(ctx.last() ? 0.0 : static_cast<double>(depth_ - 1) / static_cast<double>(k_),
                       ctx.model().parameters());
    STAGEWISE_ASSIGN_OR_RETURN(torch::serialize::InputArchive* const state,
                               ResumeState(ctx, "petra"));
    if (state != nullptr) {
      STAGEWISE_RETURN_IF_ERROR(Restore(ctx, *state));
    }
    return RunDrainedPipeline(
        ctx, depth_, [&](int64_t t) { return Forward(ctx, t); },
        [&](int64_t t) { return Backward(ctx, t); });
  }

 private:
  // What a mini-batch leaves behind between its forward and its backward.
  struct InFlight {
    std::vector<torch::Tensor> inputs;  // per block: stored input (non-reversible only)
    int64_t updates_at_forward = 0;     // optimizer steps done when it went forward
    std::vector<int64_t> out_shape;     // what went forward: the shape x and grad come back in
  };

  // One backward pass done: Delta_j += grad / k was accumulated in .grad (the
  // 1/k is applied here); every k-th pass steps and zeroes.
  // Mini-batch t's backward pass done.
  absl::Status Accumulate(StageContext& ctx, int64_t t, double loss, int64_t samples) {
    ++backwards_;
    if (backwards_ % k_ == 0) {
      AverageWindowGrads(ctx.model().parameters(), k_);
      // The schedule advances in mini-batches: an update uses the learning rate
      // of the first mini-batch of its window.
      STAGEWISE_RETURN_IF_ERROR(corrections_.Step(ctx, t, ctx.LearningRate(backwards_ - k_)));
      ctx.optimizer().zero_grad();
      ++updates_;
    }
    ctx.ReportStep(backwards_, loss, samples);
    return absl::OkStatus();
  }

  void ReportBuffers(StageContext& ctx) {
    int64_t bytes = 0, held = 0, verify = 0;
    for (const auto& [t, f] : inflight_) {
      const int64_t here = TensorBytes(f.inputs);
      bytes += here;
      held += here > 0 ? 1 : 0;
    }
    for (const auto& [t, v] : verify_inputs_) verify += TensorBytes(v);
    ctx.stage_metrics().SetMemory("inputs", bytes);
    if (verify_) ctx.stage_metrics().SetMemory("verify_inputs", verify);
    if (bytes > peak_input_bytes_) {
      peak_input_bytes_ = bytes;
      ctx.Summarize("peak_input_bytes", static_cast<double>(bytes));
    }
    if (held > peak_inputs_) {
      peak_inputs_ = held;
      ctx.Summarize("peak_inputs", static_cast<double>(held));
    }
  }

  absl::Status Forward(StageContext& ctx, int64_t t) {
    STAGEWISE_ASSIGN_OR_RETURN(ForwardInput in, StageInput(ctx, t));
    if (ctx.last()) {
      // Algorithm 1, lines 26-32: forward, loss and backward at once; running
      // statistics move in this (only) pass.
      const double loss = LossBackward(ctx, t, in);
      // Narrowed for the wire before the step ends the emulated device's span.
      const torch::Tensor grad = ctx.PrepareSend(Side::kPrev, in.x.grad());
      const torch::Tensor x = ctx.PrepareSend(Side::kPrev, in.x.detach());
      ctx.stage_metrics().SetStaleness(0);
      STAGEWISE_RETURN_IF_ERROR(Accumulate(ctx, t, loss, in.labels.size(0)));
      return SendGrad(ctx, t, 0, grad, x);
    }
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor x = in.x;
    InFlight& f = inflight_[t];
    f.updates_at_forward = updates_;
    f.inputs.resize(blocks_.size());
    std::vector<torch::Tensor> seen;
    torch::Tensor h = x;
    // predict_weights: the forward at w + s (w - w_prev); w comes back after.
    const std::vector<torch::Tensor> current = corrections_.Predict();
    {
      torch::NoGradGuard no_grad;
      models::FreezeRunningStats freeze;  // batch statistics, running ones untouched
      for (size_t i = 0; i < blocks_.size(); ++i) {
        if (!blocks_[i]->reversible() || Stores(ctx, i)) f.inputs[i] = h;
        if (verify_) seen.push_back(h);
        h = blocks_[i]->forward(h);
      }
    }
    corrections_.Restore(current);
    if (verify_) verify_inputs_[t] = std::move(seen);
    f.out_shape = h.sizes().vec();
    h = ctx.PrepareSend(Side::kNext, h);
    TimeCompute(ctx, "forward", t, 0, t0);
    ReportBuffers(ctx);
    return SendForward(ctx, t, 0, h, in.labels, std::move(in.labels_proto));
  }

  absl::Status Backward(StageContext& ctx, int64_t t) {
    torch::Tensor h;  // the rebuilt activation, going down block by block
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor g, ReceiveGrad(ctx, t, 0, &h));
    auto it = inflight_.find(t);
    if (it == inflight_.end()) {
      return absl::InternalError(absl::StrCat("no forward record for mini-batch ", t));
    }
    InFlight f = std::move(it->second);
    inflight_.erase(it);
    // Both tensors must have the shape this stage sent (micro-batches of
    // text may differ in length, so not the plan's).
    STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("x", h.sizes(), f.out_shape));
    STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("grad", g.sizes(), f.out_shape));
    const int64_t samples = g.size(0);
    double rebuild_time = 0, backward_time = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = static_cast<int>(blocks_.size()) - 1; i >= 0; --i) {
      const bool need_input_grad = i > 0 || !ctx.first();
      if (blocks_[i]->reversible() && !f.inputs[i].defined()) {
        // Eq. (4): rebuild (x, x~) from (y, y~) = (x~ + F(x), x) with the
        // current parameters, keeping the graph of F(x), and take the VJP in
        // the same pass (the planner's profiler times this very function).
        // Running statistics move here, once.
        auto* block = static_cast<models::ReversibleBlock*>(blocks_[i].get());
        const auto t0 = std::chrono::steady_clock::now();
        auto [rebuilt, dx] = models::RebuildBackward(*block, h, g, need_input_grad);
        backward_time += SecondsSince(t0);
        h = rebuilt;
        g = dx;
      } else {
        // Not invertible (or stored): the stored input, recomputed with a graph.
        torch::Tensor x = f.inputs[i];
        if (!x.defined()) return absl::InternalError(absl::StrCat("no input for block ", i));
        f.inputs[i] = torch::Tensor();
        if (need_input_grad) x = x.detach().requires_grad_(true);
        const auto t0 = std::chrono::steady_clock::now();
        torch::Tensor out = blocks_[i]->forward(x);
        const auto t1 = std::chrono::steady_clock::now();
        rebuild_time += std::chrono::duration<double>(t1 - t0).count();
        out.backward(g);
        backward_time += SecondsSince(t1);
        g = need_input_grad ? x.grad() : torch::Tensor();
        h = x.detach();
      }
      if (verify_) CheckRebuild(ctx, t, i, h);
    }
    verify_inputs_.erase(t);
    ctx.stage_metrics().ObserveCompute("recompute", rebuild_time);
    ctx.stage_metrics().ObserveCompute("backward", backward_time);
    // One span for the pass: rebuilds and VJPs alternate block by block.
    TraceSpan(ctx, v1::SPAN_BACKWARD, t, 0, start);
    g = ctx.PrepareSend(Side::kPrev, g);
    h = ctx.PrepareSend(Side::kPrev, h);
    ReportStaleness(ctx, updates_ - f.updates_at_forward, &max_staleness_);
    STAGEWISE_RETURN_IF_ERROR(Accumulate(ctx, t, 0.0, samples));
    ReportBuffers(ctx);
    return SendGrad(ctx, t, 0, g, h);
  }

  // A resumed run: the counters must match the cut's step; the open window's
  // gradient sums go back into .grad.
  absl::Status Restore(StageContext& ctx, torch::serialize::InputArchive& state) {
    STAGEWISE_ASSIGN_OR_RETURN(const int64_t backwards, ReadStateInt(state, "backwards"));
    STAGEWISE_ASSIGN_OR_RETURN(const int64_t updates, ReadStateInt(state, "updates"));
    if (backwards != backwards_ || updates != updates_) {
      return absl::DataLossError(absl::StrCat(
          "resume state: petra saved ", backwards, " backward passes and ", updates,
          " updates, the job resumes at step ", backwards_, " with accumulation ", k_));
    }
    std::vector<torch::Tensor> params = ctx.model().parameters();
    STAGEWISE_RETURN_IF_ERROR(
        ReadPartialGrads(state, params, backwards_ % k_ != 0, ctx.device(), "petra"));
    return corrections_.Load(ctx, state, "petra");
  }

  // Block mode "store" (the planner): the reversible block keeps its input
  // and is recomputed from it exactly, like a non-reversible one.
  static bool Stores(StageContext& ctx, size_t i) {
    return i < ctx.block_modes().size() && ctx.block_modes()[i] == models::BlockMode::kStore;
  }

  // verify_rebuild: relative distance of block i's rebuilt input from the one
  // its forward saw (for integer inputs, 0 if equal and 1 if not); the summary
  // keeps the largest per block.
  void CheckRebuild(StageContext& ctx, int64_t t, int i, const torch::Tensor& rebuilt) {
    auto it = verify_inputs_.find(t);
    if (it == verify_inputs_.end() || static_cast<size_t>(i) >= it->second.size()) return;
    const torch::Tensor& seen = it->second[i];
    // Token ids (a text model's first block) come from the buffer: equal or not.
    const double err = seen.is_floating_point()
                           ? ((rebuilt - seen).norm() / seen.norm().clamp_min(1e-12)).item<double>()
                           : (torch::equal(rebuilt, seen) ? 0.0 : 1.0);
    auto [slot, fresh] = rebuild_error_.try_emplace(i, err);
    if (!fresh && err <= slot->second) return;
    slot->second = err;
    ctx.Summarize(absl::StrCat("rebuild_error.block", blocks_[i]->info().index), err);
  }

  const int64_t k_;
  const bool verify_;
  DelayCorrections corrections_;  // s = (depth_ - 1) / k (0 on the last stage)
  int64_t depth_ = 1;
  int64_t backwards_ = 0;  // backward passes done (mini-batches)
  int64_t updates_ = 0;    // optimizer steps done
  int64_t peak_inputs_ = 0;
  int64_t peak_input_bytes_ = 0;
  int64_t max_staleness_ = 0;
  std::vector<std::shared_ptr<models::Block>> blocks_;
  std::map<int64_t, InFlight> inflight_;
  std::map<int64_t, std::vector<torch::Tensor>> verify_inputs_;
  std::map<int, double> rebuild_error_;  // per block, the largest so far
};

}  // namespace

std::unique_ptr<Algorithm> MakePetra(const PetraOptions& options) {
  return std::make_unique<Petra>(options);
}

}  // namespace stagewise::worker
