// nwise: "Interlocking Backpropagation: Improving Depthwise Model-Parallelism"
// (Gomez, Key et al.; Sec. 3 and App. B.2); docs/algorithms.md, "nwise".
//
// Stage j < J-1 owns an auxiliary head h_j and a local loss L_j = CE(h_j(x_j), y);
// the last stage's loss L_{J-1} is the model's. The main parameters of stage j
// are trained by L_{own(j)}, own(j) = min(j+n-1, J-1), whose gradient travels
// down through the stages in between; they only pass it on (the VJP with
// respect to their input) without adding it to their own gradients. So the
// gradient of L_m stops at stage lower(m) = m-n+1 (m < J-1) or max(J-n, 0)
// (m = J-1), after at most n-1 boundaries, and a loss with lower(m) < 0 only
// trains its aux head. With mix_local, stage j's main gradient is the mean of
// its local loss's and its far loss's. Aux heads are trained by their own
// loss. n = 1 is local learning with no backward traffic; n = J is end-to-end
// backprop (no aux heads are built then).
//
// Synchronous (the interlock): per mini-batch the stage forwards its M
// micro-batches with a graph (sending each up at once), backpropagates its own
// loss, then processes every gradient its successor sends for this mini-batch
// (up to n-1 per micro-batch), steps, and only then takes the next mini-batch.
// Each micro-batch's loss is scaled by n_m/B, so gradients are mini-batch means.
// BatchNorm running statistics move in the single forward pass.
//
// Checkpoints: the cut is the mini-batch boundary, where nothing is in flight
// (every gradient of the mini-batch was received and the stage stepped); the
// state besides model and optimizer is the aux head (parameters, BatchNorm
// buffers) and its optimizer, which SaveState writes and a resumed run loads
// after building them. A resume on another cut (StageContext::resharded)
// builds a fresh aux head and optimizer (from the seed, as at a phase start):
// the head sits at the stage's output, which moved.
#include <chrono>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/models/aux_head.h"
#include "services/models/loss.h"
#include "worker/algorithms/common.h"
#include "worker/algorithms/schedule.h"

namespace stagewise::worker {
namespace {

class Nwise : public Algorithm {
 public:
  explicit Nwise(const NwiseOptions& options)
      : n_(options.n),
        mix_local_(options.mix_local),
        micro_batches_(options.micro_batches),
        aux_head_(options.aux_head) {}

  absl::Status Run(StageContext& ctx) override {
    J_ = ctx.num_stages();
    j_ = ctx.stage();
    if (n_ > J_) {
      return absl::InvalidArgumentError(
          absl::StrCat("algorithm.n: must be <= stages.count (", J_, "), got ", n_));
    }
    STAGEWISE_RETURN_IF_ERROR(Setup(ctx));
    STAGEWISE_ASSIGN_OR_RETURN(torch::serialize::InputArchive* const state,
                               ResumeState(ctx, "nwise"));
    if (state != nullptr) {
      STAGEWISE_ASSIGN_OR_RETURN(const int64_t saved, ReadStateInt(*state, "aux_head"));
      if (saved != (head_ ? 1 : 0)) {
        return absl::DataLossError(absl::StrCat("resume state: nwise saved ", saved ? "an" : "no",
                                                " aux head, this stage has ",
                                                head_ ? "one" : "none"));
      }
      if (head_) {
        STAGEWISE_RETURN_IF_ERROR(ReadStateModule(*state, "aux_head_module", *head_));
        STAGEWISE_RETURN_IF_ERROR(ReadStateOptimizer(*state, "aux_optimizer", *aux_optimizer_));
      }
    }
    return RunLockStep(ctx, [&](int64_t t) { return MiniBatch(ctx, t); });
  }

  absl::Status SaveState(StageContext&, torch::serialize::OutputArchive& archive) override {
    WriteStateInt(archive, "aux_head", head_ ? 1 : 0);
    if (head_) {
      WriteStateModule(archive, "aux_head_module", *head_);
      WriteStateOptimizer(archive, "aux_optimizer", *aux_optimizer_);
    }
    return absl::OkStatus();
  }

 private:
  int64_t own(int64_t j) const { return std::min(j + n_ - 1, J_ - 1); }
  // The lowest stage the gradient of L_m reaches (negative: none trained).
  int64_t lower(int64_t m) const {
    return m == J_ - 1 ? std::max<int64_t>(J_ - n_, 0) : m - n_ + 1;
  }
  // Whether L_m's gradient leaves stage m at all.
  bool travels(int64_t m) const { return n_ > 1 && m > 0 && lower(m) >= 0 && lower(m) < m; }
  // Whether L_j (j < J-1) trains any main parameters; if not, no aux head.
  bool local_used(int64_t j) const { return n_ == 1 || mix_local_ || travels(j); }

  absl::Status Setup(StageContext& ctx) {
    params_ = ctx.model().parameters();
    // Gradients arriving from stage j+1: every L_m, m > j, that reaches j.
    for (int64_t m = j_ + 1; m < J_; ++m) {
      if (travels(m) && lower(m) <= j_) incoming_.insert(m);
    }
    if (!ctx.last() && local_used(j_)) {
      STAGEWISE_ASSIGN_OR_RETURN(auto spec, ParseAuxHeadSpec(aux_head_));
      STAGEWISE_ASSIGN_OR_RETURN(auto plan, models::PlanModel(ctx.spec().model));
      const int64_t classes = plan.back().out_shape.back();  // [classes] or [T, 256]
      const auto& last_block = ctx.model().blocks().back()->info();
      STAGEWISE_ASSIGN_OR_RETURN(
          head_, models::MakeAuxHead(spec, last_block.out_shape, classes,
                                     models::AuxHeadSeed(static_cast<uint64_t>(ctx.spec().seed),
                                                         last_block.index)));
      aux_optimizer_ = SetUpAuxModule(ctx, *head_, "aux_head_parameters");
    }
    ctx.Summarize("backward_passes_per_micro_batch",
                  static_cast<double>(incoming_.size() + (ctx.last() || head_ ? 1 : 0)));
    return absl::OkStatus();
  }

  // Adds `grads` (aligned with `params`) times `weight` to the .grad fields.
  static void AddGrads(const std::vector<torch::Tensor>& params,
                       const std::vector<torch::Tensor>& grads, size_t offset, double weight) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& g = grads[offset + i];
      if (!g.defined()) continue;
      torch::Tensor p = params[i];
      if (p.grad().defined()) {
        p.mutable_grad().add_(g, weight);
      } else {
        p.mutable_grad() = weight == 1.0 ? g.clone() : g * weight;
      }
    }
  }

  // One backward pass of a loss (or of a gradient at the output) through this
  // stage: main parameters get `main_weight` of it (0: none), the aux head
  // all of it (if `aux`), and the input gradient is returned if `input_grad`.
  torch::Tensor Vjp(const torch::Tensor& output, const torch::Tensor& grad_output,
                    const torch::Tensor& x, double main_weight, bool aux, bool input_grad) {
    std::vector<torch::Tensor> inputs;
    if (main_weight > 0) inputs.insert(inputs.end(), params_.begin(), params_.end());
    const size_t aux_offset = inputs.size();
    std::vector<torch::Tensor> aux_params;
    if (aux) {
      aux_params = head_->parameters();
      inputs.insert(inputs.end(), aux_params.begin(), aux_params.end());
    }
    const size_t x_offset = inputs.size();
    if (input_grad) inputs.push_back(x);
    if (inputs.empty()) return torch::Tensor();
    std::vector<torch::Tensor> grads = torch::autograd::grad(
        {output}, inputs, {grad_output}, /*retain_graph=*/true, /*create_graph=*/false,
        /*allow_unused=*/true);
    if (main_weight > 0) AddGrads(params_, grads, 0, main_weight);
    if (aux) AddGrads(aux_params, grads, aux_offset, 1.0);
    return input_grad ? grads[x_offset] : torch::Tensor();
  }

  absl::Status MiniBatch(StageContext& ctx, int64_t t) {
    const int M = micro_batches_;
    const int64_t B = ctx.batch_size();
    const bool input_grad = !ctx.first() && n_ > 1;
    ctx.optimizer().zero_grad();
    if (aux_optimizer_) aux_optimizer_->zero_grad();
    std::vector<torch::Tensor> xs(M), outs(M), labels(M);
    std::vector<torch::Tensor> data_x, data_y;
    if (ctx.first()) {
      data::Batch b = ctx.TrainBatch(t);
      data_x = b.x.to(ctx.device()).split_with_sizes(MicroBatchSizes(b.y.size(0), M));
      data_y = b.y.to(ctx.device()).split_with_sizes(MicroBatchSizes(b.y.size(0), M));
    }
    double loss_sum = 0;
    int64_t samples = 0;
    // Forward every micro-batch with a graph, sending each up at once.
    for (int mb = 0; mb < M; ++mb) {
      v1::TensorProto labels_proto;
      if (ctx.first()) {
        xs[mb] = data_x[mb];
        labels[mb] = data_y[mb];
      } else {
        STAGEWISE_ASSIGN_OR_RETURN(ForwardInput in,
                                   ReceiveForward(ctx, t, mb, /*decode_labels=*/true));
        xs[mb] = in.x;
        labels[mb] = in.labels;
        labels_proto = std::move(in.labels_proto);
      }
      if (input_grad) xs[mb].requires_grad_(true);
      const auto t0 = std::chrono::steady_clock::now();
      outs[mb] = ctx.model().forward(xs[mb]);
      TimeCompute(ctx, "forward", t, mb, t0);
      samples += labels[mb].size(0);
      if (!ctx.last()) {
        STAGEWISE_RETURN_IF_ERROR(
            SendForward(ctx, t, mb, outs[mb].detach(), labels[mb], std::move(labels_proto)));
      }
    }
    // This stage's own loss: the model's on the last stage, else the aux head's.
    if (ctx.last() || head_) {
      const bool own_is_local = ctx.last() || own(j_) == j_;
      const double main_weight = own_is_local ? 1.0 : (mix_local_ ? 0.5 : 0.0);
      for (int mb = 0; mb < M; ++mb) {
        const auto t0 = std::chrono::steady_clock::now();
        const double scale = static_cast<double>(labels[mb].size(0)) / static_cast<double>(B);
        torch::Tensor logits = ctx.last() ? outs[mb] : head_->forward(outs[mb]);
        torch::Tensor loss = models::CrossEntropy(logits, labels[mb]) * scale;
        loss_sum += loss.item<double>();
        const bool send = travels(j_);
        torch::Tensor gx = Vjp(loss, torch::ones_like(loss), xs[mb], main_weight,
                               /*aux=*/!ctx.last(), send);
        TimeCompute(ctx, "backward", t, mb, t0);
        if (send) STAGEWISE_RETURN_IF_ERROR(SendGrad(ctx, t, mb, gx, torch::Tensor(), j_));
      }
    }
    // Gradients from above: each (micro-batch, origin) exactly once.
    std::set<std::pair<int, int64_t>> pending;
    for (int mb = 0; mb < M; ++mb) {
      for (int64_t m : incoming_) pending.insert({mb, m});
    }
    while (!pending.empty()) {
      STAGEWISE_ASSIGN_OR_RETURN(v1::StageMessage msg, ctx.ReceiveFromNext());
      const int mb = msg.micro_batch();
      const int64_t m = msg.origin_stage();
      if (msg.kind() != v1::StageMessage::BACKWARD || msg.step() != t || !pending.count({mb, m})) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expected a BACKWARD gradient of step ", t, " from one of the losses ",
            absl::StrJoin(incoming_, ","), ", got ", v1::StageMessage::Kind_Name(msg.kind()),
            " step ", msg.step(), " micro-batch ", mb, " origin ", m));
      }
      pending.erase({mb, m});
      STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor g, GetTensor(msg, "grad", ctx.device()));
      STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("grad", g.sizes(), outs[mb].sizes()));
      const double main_weight = own(j_) == m ? (mix_local_ && own(j_) != j_ ? 0.5 : 1.0) : 0.0;
      const bool pass_on = lower(m) < j_;
      const auto t0 = std::chrono::steady_clock::now();
      torch::Tensor gx = Vjp(outs[mb], g, xs[mb], main_weight, /*aux=*/false, pass_on);
      TimeCompute(ctx, "backward", t, mb, t0);
      if (pass_on) STAGEWISE_RETURN_IF_ERROR(SendGrad(ctx, t, mb, gx, torch::Tensor(), m));
    }
    // Step (main and aux head) with the schedule's rate for this mini-batch.
    STAGEWISE_RETURN_IF_ERROR(StepOptimizer(ctx, t, ctx.LearningRate(t), aux_optimizer_.get()));
    ctx.stage_metrics().SetStaleness(0);
    ctx.ReportStep(t + 1, ctx.last() ? loss_sum : 0.0, samples);
    if (head_ && !ctx.last()) {
      local_loss_ = loss_sum;
      ctx.Summarize("local_loss", local_loss_);
    }
    return absl::OkStatus();
  }

  const int64_t n_;
  const bool mix_local_;
  const int micro_batches_;
  const std::string aux_head_;
  int64_t J_ = 1, j_ = 0;
  std::vector<torch::Tensor> params_;
  std::set<int64_t> incoming_;
  models::AuxHead head_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> aux_optimizer_;
  double local_loss_ = 0;
};

}  // namespace

std::unique_ptr<Algorithm> MakeNwise(const NwiseOptions& options) {
  return std::make_unique<Nwise>(options);
}

}  // namespace stagewise::worker
