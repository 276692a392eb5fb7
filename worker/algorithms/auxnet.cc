// auxnet: layer-parallel training with auxiliary-variable networks, penalty
// method ("Layer-Parallel Training of Residual Networks with Auxiliary-Variable
// Networks", Sun, Dong et al., Sec. 3.2, 4.1, 4.2 and Algorithm 1);
// docs/algorithms.md, "auxnet".
//
// Stage k >= 1 owns AuxNet_{k-1}, a low-capacity network with the main
// network's boundary shapes. Every iteration, on the same mini-batch
// everywhere:
//   1. AuxNet chain: lambda_0 is the augmented input batch (stage 0 sends it
//      up with the labels); stage k computes lambda_k = AuxNet_{k-1}(lambda_{k-1}),
//      sends it up (the next AuxNet's input) and down (stage k-1's target).
//   2. Local forward from lambda_k (stage 0 from the data): X_k = F_k(lambda_k).
//   3. Local loss beta * psi(X_k, lambda_{k+1}) (mean squared error) on every
//      stage but the last, the classification loss on the last; backward and
//      step of theta_k. p_k = d loss / d lambda_k.
//   4. X_k goes up; stage k+1 measures the constraint violation
//      ||lambda_{k+1} - X_k||, corrects lambda_{k+1} <- lambda_{k+1} -
//      eta (beta d psi(lambda_{k+1}, X_k) / d lambda + p_{k+1}) and takes one
//      distillation step of its AuxNet towards the corrected value.
// Optional Gaussian noise on the lambda a stage trains from; beta grows by
// beta_factor every beta_every_epochs epochs. Every serial_loss_every steps
// the stages also run the true serial forward (no graph, statistics frozen)
// so the last stage can report the real training loss. BatchNorm running
// statistics move in the local forward, once per sample; evaluation runs the
// serial forward through the main stages. The noise comes from the stage's
// own generator, seeded from (seed, stage), so it does not depend on what
// else draws random numbers in the process.
//
// Checkpoints: the cut is the iteration boundary, where every message of the
// iteration was consumed (the lambdas are recomputed each iteration, beta and
// the serial-loss cadence follow from the step). The state besides model and
// optimizer is stage k's AuxNet (parameters, BatchNorm buffers), its
// optimizer and the noise generator; SaveState writes them and a resumed run
// loads them after building them. A resume on another cut
// (StageContext::resharded) builds them fresh, as at a phase start: the
// AuxNet sits at a stage boundary that moved.
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "services/models/aux_net.h"
#include "services/models/batch_norm.h"
#include "services/models/loss.h"
#include "services/tensor/codec.h"
#include "worker/algorithms/auxnet_math.h"
#include "worker/algorithms/common.h"
#include "worker/algorithms/schedule.h"

namespace stagewise::worker {
namespace {

// Running mean of a per-step time, reported in the summary for eq. (27).
struct MeanTime {
  double sum = 0;
  int64_t n = 0;
  void Add(double s) {
    sum += s;
    ++n;
  }
  double mean() const { return n > 0 ? sum / static_cast<double>(n) : 0.0; }
};

class AuxNetAlgorithm : public Algorithm {
 public:
  explicit AuxNetAlgorithm(const AuxNetOptions& options)
      : beta_(options.beta),
        beta_factor_(options.beta_factor),
        beta_every_epochs_(options.beta_every_epochs),
        eta_(options.aux_lr),
        kind_(options.auxnet),
        blocks_(options.auxnet_blocks),
        noise_std_(options.noise_std),
        serial_every_(options.serial_loss_every),
        serial_statistics_(options.bn_statistics == BnStatistics::kSerial),
        direct_(options.aux_update == AuxUpdate::kDirect),
        relative_(options.penalty == AuxPenalty::kRelative) {}

  absl::Status Run(StageContext& ctx) override {
    STAGEWISE_RETURN_IF_ERROR(Setup(ctx));
    STAGEWISE_ASSIGN_OR_RETURN(torch::serialize::InputArchive* const state,
                               ResumeState(ctx, "auxnet"));
    if (state != nullptr) {
      STAGEWISE_RETURN_IF_ERROR(Restore(*state));
    }
    const int64_t T = ctx.total_steps();
    window_ = std::max<int64_t>(1, std::min<int64_t>(10, T / 5));
    STAGEWISE_RETURN_IF_ERROR(RunLockStep(ctx, [&](int64_t t) { return Iteration(ctx, t); }));
    Finish(ctx);
    return absl::OkStatus();
  }

  // Stage k >= 1: AuxNet_{k-1}, its optimizer and the noise generator.
  absl::Status SaveState(StageContext&, torch::serialize::OutputArchive& archive) override {
    WriteStateInt(archive, "auxnet", auxnet_ ? 1 : 0);
    if (!auxnet_) return absl::OkStatus();
    WriteStateModule(archive, "auxnet_module", *auxnet_);
    WriteStateOptimizer(archive, "aux_optimizer", *aux_optimizer_);
    torch::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(noise_.mutex());
      rng = noise_.get_state();
    }
    WriteStateTensor(archive, "noise_rng", rng);
    return absl::OkStatus();
  }

 private:
  absl::Status Setup(StageContext& ctx) {
    if (ctx.first()) return absl::OkStatus();
    // AuxNet_{k-1} maps stage k-1's input shape to stage k's.
    STAGEWISE_ASSIGN_OR_RETURN(auto plan, models::PlanModel(ctx.spec().model));
    STAGEWISE_ASSIGN_OR_RETURN(auto ranges, models::ResolvePartition(ctx.spec().stages, plan));
    const int prev_first = ranges[ctx.stage() - 1].first;
    const auto& first = ctx.model().blocks().front()->info();
    STAGEWISE_ASSIGN_OR_RETURN(
        auxnet_, models::MakeAuxNet(kind_, plan[prev_first].in_shape, first.in_shape,
                                    models::AuxNetSeed(ctx.spec().seed, first.index), blocks_));
    aux_optimizer_ = SetUpAuxModule(ctx, *auxnet_, "auxnet_parameters");
    constexpr uint64_t kNoiseStream = 0x6e6f697365ULL;  // "noise"
    noise_ = at::make_generator<at::CPUGeneratorImpl>(
        models::AuxNetSeed(ctx.spec().seed, first.index) ^ kNoiseStream);
    return absl::OkStatus();
  }

  absl::Status Restore(torch::serialize::InputArchive& state) {
    STAGEWISE_ASSIGN_OR_RETURN(const int64_t saved, ReadStateInt(state, "auxnet"));
    if (saved != (auxnet_ ? 1 : 0)) {
      return absl::DataLossError(absl::StrCat("resume state: auxnet saved ", saved ? "an" : "no",
                                              " AuxNet, this stage has ",
                                              auxnet_ ? "one" : "none"));
    }
    if (!auxnet_) return absl::OkStatus();
    STAGEWISE_RETURN_IF_ERROR(ReadStateModule(state, "auxnet_module", *auxnet_));
    STAGEWISE_RETURN_IF_ERROR(ReadStateOptimizer(state, "aux_optimizer", *aux_optimizer_));
    STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor rng, ReadStateTensor(state, "noise_rng", torch::kCPU));
    try {
      std::lock_guard<std::mutex> lock(noise_.mutex());
      noise_.set_state(rng);
    } catch (const std::exception& e) {
      return absl::DataLossError(absl::StrCat("resume state: 'noise_rng': ", e.what()));
    }
    return absl::OkStatus();
  }

  double BetaAt(const StageContext& ctx, int64_t t) const {
    if (beta_every_epochs_ <= 0 || beta_factor_ == 1.0) return beta_;
    const int64_t epochs = t / std::max<int64_t>(1, ctx.steps_per_epoch());
    return beta_ * std::pow(beta_factor_, static_cast<double>(epochs / beta_every_epochs_));
  }

  absl::Status SendAux(StageContext& ctx, bool up, int64_t t, int kind, const torch::Tensor& v,
                       const v1::TensorProto* labels) {
    v1::StageMessage m = NewMessage(v1::StageMessage::AUX, t, kind);
    STAGEWISE_RETURN_IF_ERROR(PutTensor(&m, "lambda", v, ctx.Wire(up)));
    if (labels != nullptr) (*m.mutable_tensors())["labels"] = *labels;
    return up ? ctx.SendToNext(std::move(m)) : ctx.SendToPrev(std::move(m));
  }

  static absl::StatusOr<torch::Tensor> Expect(absl::StatusOr<v1::StageMessage> msg,
                                              v1::StageMessage::Kind kind, int64_t t, int mb,
                                              const char* name, torch::Device device,
                                              v1::TensorProto* labels = nullptr) {
    if (!msg.ok()) return msg.status();
    STAGEWISE_RETURN_IF_ERROR(ExpectMessage(*msg, kind, t, mb));
    if (labels != nullptr) {
      auto it = msg->tensors().find("labels");
      if (it == msg->tensors().end()) {
        return absl::InvalidArgumentError("StageMessage.tensors: AUX message without 'labels'");
      }
      *labels = it->second;
    }
    return GetTensor(*msg, name, device);
  }

  absl::Status Iteration(StageContext& ctx, int64_t t) {
    constexpr int kChain = 0, kSerial = 1;  // AUX micro_batch: what the message carries
    const double beta = BetaAt(ctx, t);
    const bool serial = serial_every_ > 0 && ((t + 1) % serial_every_ == 0 || t == 0);
    // Where BatchNorm running statistics move (bn_statistics): the local
    // forward from lambda, or the serial forward of the true activations.
    std::optional<models::FreezeRunningStats> freeze_local;
    // 1. The AuxNet chain.
    torch::Tensor x, labels, lambda, lambda_prev;
    v1::TensorProto labels_proto;
    if (ctx.first()) {
      const auto t0 = std::chrono::steady_clock::now();
      data::Batch b = ctx.TrainBatch(t);
      x = b.x.to(ctx.device());
      labels = b.y.to(ctx.device());
      data_time_.Add(SecondsSince(t0));
      if (!ctx.last()) {
        STAGEWISE_RETURN_IF_ERROR(EncodeTensor(labels, &labels_proto));
        STAGEWISE_RETURN_IF_ERROR(SendAux(ctx, true, t, kChain, x, &labels_proto));
      }
    } else {
      STAGEWISE_ASSIGN_OR_RETURN(
          lambda_prev, Expect(ctx.ReceiveFromPrev(), v1::StageMessage::AUX, t, kChain, "lambda",
                              ctx.device(), &labels_proto));
      if (ctx.last()) {
        STAGEWISE_ASSIGN_OR_RETURN(labels, DecodeTensor(labels_proto));
        labels = labels.to(ctx.device());
      }
      const auto t0 = std::chrono::steady_clock::now();
      lambda = auxnet_->forward(lambda_prev);  // graph kept for the distillation
      aux_forward_.Add(SecondsSince(t0));
      if (!ctx.last()) {
        STAGEWISE_RETURN_IF_ERROR(SendAux(ctx, true, t, kChain, lambda, &labels_proto));
      }
      STAGEWISE_RETURN_IF_ERROR(SendAux(ctx, false, t, kChain, lambda, nullptr));
      x = lambda.detach();
      if (noise_std_ > 0) {
        const torch::Tensor noise =
            torch::randn(x.sizes(), noise_, torch::TensorOptions().dtype(x.scalar_type()));
        x = x + noise_std_ * noise.to(x.device());
      }
      x.requires_grad_(true);
    }
    // 2. Stage k-1's target, lambda_{k+1}, from above.
    torch::Tensor target;
    if (!ctx.last()) {
      STAGEWISE_ASSIGN_OR_RETURN(target, Expect(ctx.ReceiveFromNext(), v1::StageMessage::AUX, t,
                                                kChain, "lambda", ctx.device()));
    }
    // 3. Local forward, loss, backward and step.
    const auto t1 = std::chrono::steady_clock::now();
    if (serial_statistics_) freeze_local.emplace();
    torch::Tensor out = ctx.model().forward(x);
    freeze_local.reset();
    const auto t2 = std::chrono::steady_clock::now();
    forward_time_.Add(std::chrono::duration<double>(t2 - t1).count());
    if (!ctx.last()) {
      STAGEWISE_RETURN_IF_ERROR(CheckOutputShape("lambda", target.sizes(), out.sizes()));
    }
    torch::Tensor loss =
        ctx.last() ? models::CrossEntropy(out, labels)
                   : beta * (relative_ ? RelativePenalty(out, target) : Penalty(out, target));
    const auto t3 = std::chrono::steady_clock::now();
    penalty_time_.Add(std::chrono::duration<double>(t3 - t2).count());
    ctx.optimizer().zero_grad();
    loss.backward();
    const auto stepped = std::chrono::steady_clock::now();
    // Replicated stages: the stage's gradients averaged among its replicas
    // (sync.every is 1 with auxnet), then the step.
    STAGEWISE_RETURN_IF_ERROR(ctx.AverageReplicaGradients(nullptr));
    StepAt(ctx.optimizer(), ctx.LearningRate(t));
    backward_time_.Add(SecondsSince(t3));
    TimeCompute(ctx, "forward", t, 0, t1, t2);
    TimeCompute(ctx, "backward", t, 0, t2, stepped);
    TimeCompute(ctx, "step", t, 0, stepped);
    ctx.stage_metrics().IncSteps();
    const double loss_value = loss.item<double>();
    ctx.stage_metrics().SetValue(ctx.last() ? "local_loss" : "penalty_loss", loss_value);
    if (!ctx.last()) {
      penalty_loss_ = loss_value;
      STAGEWISE_RETURN_IF_ERROR(SendForward(ctx, t, 0, out.detach(), labels, labels_proto));
    } else {
      local_loss_ = loss_value;
    }
    // The true serial forward (post-update parameters), stage 0's part.
    torch::Tensor serial_out;
    if (serial && ctx.first()) {
      torch::NoGradGuard no_grad;
      std::optional<models::FreezeRunningStats> freeze;
      if (!serial_statistics_) freeze.emplace();
      serial_out = ctx.model().forward(x);
    }
    // 4. Correction of lambda_k and distillation of AuxNet_{k-1}.
    if (!ctx.first()) {
      STAGEWISE_ASSIGN_OR_RETURN(
          const torch::Tensor x_prev,
          Expect(ctx.ReceiveFromPrev(), v1::StageMessage::FORWARD, t, 0, "x", ctx.device()));
      STAGEWISE_RETURN_IF_ERROR(
          CheckOutputShape("x", x_prev.sizes(), lambda.sizes(), "this stage's input"));
      const auto t4 = std::chrono::steady_clock::now();
      const double violation = ConstraintViolation(lambda.detach(), x_prev);
      RecordViolation(ctx, violation, RelativeGap(lambda.detach(), x_prev));
      aux_optimizer_->zero_grad();
      if (direct_) {
        // aux_update: direct (the paper's ReAuxNet rule, eq. (29)): AuxNet_{k-1}
        // descends beta psi(lambda_k, X_{k-1}) + stage k's loss through lambda_k.
        lambda.backward(beta * PenaltyGradOf(relative_, lambda, x_prev) + x.grad());
      } else {
        // distill (Algorithm 1): correct lambda_k, then fit the AuxNet to it.
        // The plain penalty's gradient in closed form, the relative one by autograd.
        // Both gradients are of means over this replica's B / R samples: a
        // sample's is R times its share of the mini-batch's mean, so 1 / R
        // makes the correction the J x 1 run's (replicas: 1 leaves it).
        const double share = 1.0 / ctx.num_replicas();
        const torch::Tensor psi_grad =
            relative_ ? PenaltyGradOf(true, lambda, x_prev) : PenaltyGrad(lambda.detach(), x_prev);
        const torch::Tensor corrected =
            CorrectLambdaWithGrad(lambda.detach(), share * psi_grad, share * x.grad(), beta, eta_);
        Penalty(lambda, corrected).backward();
      }
      // The auxiliary network's gradients averaged among the replicas too.
      STAGEWISE_RETURN_IF_ERROR(ctx.AverageReplicaGradientsOf(*aux_optimizer_));
      StepAt(*aux_optimizer_, ctx.LearningRate(t));
      aux_backward_.Add(SecondsSince(t4));
      TimeCompute(ctx, "aux", t, 0, t4);
      if (serial) {
        STAGEWISE_ASSIGN_OR_RETURN(torch::Tensor s,
                                   Expect(ctx.ReceiveFromPrev(), v1::StageMessage::AUX, t, kSerial,
                                          "lambda", ctx.device()));
        torch::NoGradGuard no_grad;
        std::optional<models::FreezeRunningStats> freeze;
        if (!serial_statistics_) freeze.emplace();
        serial_out = ctx.model().forward(s);
        // How far the true activations drifted from the lambda this stage
        // trains from, the chain's errors compounded.
        RecordSerialGap(ctx, RelativeGap(s, lambda.detach()));
      }
    }
    if (serial && !ctx.last()) {
      STAGEWISE_RETURN_IF_ERROR(SendAux(ctx, true, t, kSerial, serial_out, nullptr));
    }
    if (serial && ctx.last()) {
      serial_loss_ = models::CrossEntropy(serial_out, labels).item<double>();
      have_serial_ = true;
      ctx.stage_metrics().SetValue("serial_loss", serial_loss_);
      ctx.Summarize("serial_train_loss", serial_loss_);
    }
    ctx.ReportStep(t + 1, have_serial_ ? serial_loss_ : local_loss_, x.size(0));
    return absl::OkStatus();
  }

  // Keeps the first and the last `window` values of a per-step measurement.
  struct Window {
    std::vector<double> first;
    std::deque<double> last;
    void Add(double v, int64_t window) {
      if (static_cast<int64_t>(first.size()) < window) first.push_back(v);
      last.push_back(v);
      if (static_cast<int64_t>(last.size()) > window) last.pop_front();
    }
  };

  void RecordViolation(StageContext& ctx, double v, double relative) {
    ctx.stage_metrics().SetValue("constraint_violation", v);
    ctx.stage_metrics().SetValue("relative_violation", relative);
    violations_.Add(v, window_);
    relative_violations_.Add(relative, window_);
  }

  void RecordSerialGap(StageContext& ctx, double gap) {
    ctx.stage_metrics().SetValue("serial_gap", gap);
    serial_gaps_.Add(gap, window_);
  }

  void Finish(StageContext& ctx) {
    auto mean = [](const auto& values) {
      double s = 0;
      for (double v : values) s += v;
      return values.empty() ? 0.0 : s / static_cast<double>(values.size());
    };
    auto summarize = [&](const char* name, const Window& w) {
      if (w.first.empty()) return;
      ctx.Summarize(absl::StrCat(name, "_start"), mean(w.first));
      ctx.Summarize(absl::StrCat(name, "_end"), mean(w.last));
    };
    summarize("constraint_violation", violations_);
    summarize("relative_violation", relative_violations_);
    summarize("serial_gap", serial_gaps_);
    if (!ctx.last()) ctx.Summarize("penalty_loss", penalty_loss_);
    if (ctx.last()) ctx.Summarize("local_loss", local_loss_);
    // Per-step means for the speed-up model (the AuxNet paper, eq. (27)).
    if (ctx.first()) ctx.Summarize("data_seconds", data_time_.mean());
    ctx.Summarize("forward_seconds", forward_time_.mean());
    ctx.Summarize("penalty_seconds", penalty_time_.mean());
    ctx.Summarize("backward_seconds", backward_time_.mean());
    if (!ctx.first()) {
      ctx.Summarize("aux_forward_seconds", aux_forward_.mean());
      ctx.Summarize("aux_backward_seconds", aux_backward_.mean());
    }
  }

  const double beta_;
  const double beta_factor_;
  const int64_t beta_every_epochs_;
  const double eta_;
  const AuxNetArch kind_;
  const int blocks_;  // residual blocks of a resnet AuxNet
  const double noise_std_;
  const int64_t serial_every_;
  // bn_statistics: serial: running statistics move in the serial forward
  // (the activations evaluation will see), not in the local one (from lambda).
  const bool serial_statistics_;
  // aux_update: direct: the AuxNet gets the gradient of the penalty and of
  // the stage's loss with respect to lambda; distill: it is fitted to the
  // corrected lambda.
  const bool direct_;
  // penalty: relative: psi is scale-free (RelativePenalty), so the stages and
  // the AuxNets gain nothing by shrinking their outputs together.
  const bool relative_;
  models::AuxNet auxnet_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> aux_optimizer_;
  at::Generator noise_;  // stage k >= 1: the noise on lambda_k
  int64_t window_ = 1;
  Window violations_, relative_violations_, serial_gaps_;
  double penalty_loss_ = 0, local_loss_ = 0, serial_loss_ = 0;
  bool have_serial_ = false;
  MeanTime data_time_, forward_time_, penalty_time_, backward_time_, aux_forward_, aux_backward_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeAuxNet(const AuxNetOptions& options) {
  return std::make_unique<AuxNetAlgorithm>(options);
}

}  // namespace stagewise::worker
