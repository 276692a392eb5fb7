// The auxiliary-variable correction of the penalty method (the AuxNet paper, eq. (11)
// and Algorithm 1), in closed form so it can be tested against autograd.
#ifndef STAGEWISE_WORKER_ALGORITHMS_AUXNET_MATH_H_
#define STAGEWISE_WORKER_ALGORITHMS_AUXNET_MATH_H_

#include <torch/torch.h>

namespace stagewise::worker {

// psi(a, b) = mean((a - b)^2) over every element (the batch included).
inline torch::Tensor Penalty(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::mse_loss(a, b);
}

// The scale-free penalty (`penalty: relative`): the mean squared difference
// over the mean square of the two sides, so shrinking both together gains
// nothing.
inline torch::Tensor RelativePenalty(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::mse_loss(a, b) / (0.5 * (a.square().mean() + b.square().mean()) + 1e-20);
}

// d psi(lambda, x_prev) / d lambda by autograd, psi the relative or the plain
// penalty.
inline torch::Tensor PenaltyGradOf(bool relative, const torch::Tensor& lambda,
                                   const torch::Tensor& x_prev) {
  torch::AutoGradMode enable(true);
  torch::Tensor l = lambda.detach().requires_grad_(true);
  torch::Tensor psi = relative ? RelativePenalty(l, x_prev.detach()) : Penalty(l, x_prev.detach());
  return torch::autograd::grad({psi}, {l})[0];
}

// d psi(lambda, x_prev) / d lambda for Penalty (the mean over every element).
inline torch::Tensor PenaltyGrad(const torch::Tensor& lambda, const torch::Tensor& x_prev) {
  return 2.0 / static_cast<double>(lambda.numel()) * (lambda - x_prev);
}

// lambda_k <- lambda_k - eta * (beta * psi_grad + p_k), psi_grad =
// d psi(lambda_k, X_{k-1}) / d lambda of whichever penalty, p_k the gradient
// of stage k's local loss with respect to its input lambda_k.
inline torch::Tensor CorrectLambdaWithGrad(const torch::Tensor& lambda,
                                           const torch::Tensor& psi_grad, const torch::Tensor& p,
                                           double beta, double eta) {
  return lambda - eta * (beta * psi_grad + p);
}

// The same step for the plain penalty, its gradient in closed form; x_prev =
// X_{k-1} is stage k-1's output.
inline torch::Tensor CorrectLambda(const torch::Tensor& lambda, const torch::Tensor& x_prev,
                                   const torch::Tensor& p, double beta, double eta) {
  return CorrectLambdaWithGrad(lambda, PenaltyGrad(lambda, x_prev), p, beta, eta);
}

// ||a - b|| / ||b|| over the whole batch: how far a is from b, relative to b's size.
inline double RelativeGap(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-12)).item<double>();
}

// ||lambda_k - X_{k-1}|| per sample: the Frobenius norm over the batch divided
// by sqrt(batch size) (so it does not grow with the batch).
inline double ConstraintViolation(const torch::Tensor& lambda, const torch::Tensor& x_prev) {
  return ((lambda - x_prev).norm() / std::sqrt(static_cast<double>(lambda.size(0)))).item<double>();
}

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_AUXNET_MATH_H_
