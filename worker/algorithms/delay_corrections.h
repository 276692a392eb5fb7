// Staleness corrections shared by `delayed` and `petra` (docs/algorithms.md,
// "Staleness corrections"). A stage whose gradients arrive s updates after
// its forward can
//   - step at a learning rate scaled by 1/(1+s) or 1/sqrt(1+s) (lr_by_delay);
//   - step at momentum max(0, m - s/(1+s)), the delay acting as momentum of
//     its own (momentum_by_delay: compensate; m is SGD's momentum or Adam's
//     beta1); m is set for the step and put back after it, so the
//     optimizer's saved options keep the job's m;
//   - run its forward at the weights extrapolated along the last update,
//     w + s (w - w_prev) (predict_weights): the weights its gradient will meet.
//     w_prev is one copy of the parameters, taken before each step; it is
//     checkpointed with the algorithm's state (Save/Load), so a resume in the
//     same phase and cut predicts as the run that went through; a resume on
//     another cut starts without (its first forward predicts nothing, as the
//     first of a job).
#ifndef STAGEWISE_WORKER_ALGORITHMS_DELAY_CORRECTIONS_H_
#define STAGEWISE_WORKER_ALGORITHMS_DELAY_CORRECTIONS_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/spec/enums.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

class DelayCorrections {
 public:
  struct Options {
    DelayLr lr_by_delay = DelayLr::kConstant;
    DelayMomentum momentum_by_delay = DelayMomentum::kConstant;
    bool predict_weights = false;
  };
  explicit DelayCorrections(const Options& options) : options_(options) {}

  // At the start of a run: the stage's staleness in updates (0 on the last
  // stage) and its parameters; forgets w_prev.
  void Start(double staleness, std::vector<torch::Tensor> params);
  // The scale lr_by_delay puts on the stage's learning rate.
  double lr_scale() const;
  // Bytes of w_prev (0 until the first step, or without predict_weights):
  // memory kind `previous_parameters`, summary `previous_parameter_bytes`,
  // set when w_prev is first taken (or loaded).
  int64_t held_bytes() const;

  // The stage's optimizer step (StepOptimizer) of mini-batch `t` at
  // lr x lr_scale(), with momentum compensated; w_prev is taken first.
  absl::Status Step(StageContext& ctx, int64_t t, double lr);

  // predict_weights: moves the parameters to w + s (w - w_prev) and returns
  // w, for Restore after the forward; empty (nothing moved) before the first
  // step, at s = 0 or without the option.
  std::vector<torch::Tensor> Predict();
  void Restore(const std::vector<torch::Tensor>& saved);

  // predict_weights: w_prev in the algorithm's state (nothing without the
  // option). Load (after Start) puts it back, DATA_LOSS naming `algorithm`
  // when its count or shapes do not match the stage's parameters; a state
  // without the entry leaves none (the next forward predicts nothing).
  void Save(torch::serialize::OutputArchive& archive) const;
  absl::Status Load(StageContext& ctx, torch::serialize::InputArchive& archive,
                    const std::string& algorithm);

 private:
  void ReportHeld(StageContext& ctx) const;
  // SGD's momentum or Adam's beta1 (0 for another optimizer), and its setter.
  static double Momentum(torch::optim::OptimizerOptions& options);
  static void SetMomentum(torch::optim::OptimizerOptions& options, double momentum);

  const Options options_;
  double staleness_ = 0;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> previous_;  // predict_weights: w before the last step
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_DELAY_CORRECTIONS_H_
