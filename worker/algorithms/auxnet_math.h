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

// lambda_k <- lambda_k - eta * (beta * d psi(lambda_k, x_prev) / d lambda + p_k)
// where x_prev = X_{k-1} is stage k-1's output and p_k the gradient of stage
// k's local loss with respect to its input lambda_k.
inline torch::Tensor CorrectLambda(const torch::Tensor& lambda, const torch::Tensor& x_prev,
                                   const torch::Tensor& p, double beta, double eta) {
  const double n = static_cast<double>(lambda.numel());
  return lambda - eta * (beta * 2.0 / n * (lambda - x_prev) + p);
}

// ||lambda_k - X_{k-1}|| per sample: the Frobenius norm over the batch divided
// by sqrt(batch size) (so it does not grow with the batch).
inline double ConstraintViolation(const torch::Tensor& lambda, const torch::Tensor& x_prev) {
  return ((lambda - x_prev).norm() / std::sqrt(static_cast<double>(lambda.size(0)))).item<double>();
}

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_AUXNET_MATH_H_
