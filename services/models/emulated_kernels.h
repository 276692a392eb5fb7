// The arithmetic of the emulated model's blocks (blocks.cc), each in one pass
// over the activations where it can be.
//
// An emulated block stands for a block on an accelerator: it waits the time
// the device would take, and does a little real arithmetic (a scale and a
// shift per value of a sample) so that activations and gradients are real.
// On a machine of few cores that arithmetic competes with what the benchmarks
// measure (the stage-to-stage transport, which on a GPU host has the CPU to
// itself): LibTorch's broadcasting kernels take four to five passes over the
// activations per block, these take one. Float32 CPU tensors take the fused
// loops; anything else (another dtype, a GPU) takes the same arithmetic in
// LibTorch ops. Both give the same values up to float rounding.
#ifndef STAGEWISE_SERVICES_MODELS_EMULATED_KERNELS_H_
#define STAGEWISE_SERVICES_MODELS_EMULATED_KERNELS_H_

#include <torch/types.h>

namespace stagewise::models {

// Gradients of one emulated op; a part not asked for is undefined.
struct EmulatedGrads {
  torch::Tensor x, scale, shift;
};

// y = shift + scale * x (+ x when `residual`); x is [n, ...], scale and
// shift have x's shape without the batch dimension.
torch::Tensor EmulatedAffineForward(const torch::Tensor& x, const torch::Tensor& scale,
                                    const torch::Tensor& shift, bool residual);

// Its backward for the output gradient g: dx = g * scale (+ g),
// dscale = sum over the batch of g * x, dshift = sum over the batch of g.
// `input` / `weights`: which of them to compute.
EmulatedGrads EmulatedAffineBackward(const torch::Tensor& g, const torch::Tensor& x,
                                     const torch::Tensor& scale, bool residual, bool input,
                                     bool weights);

// The reversible coupling on x = (x1, x2), halves of dimension 1:
// y = (x2 + shift + scale * x1, x1); scale and shift have x1's shape without
// the batch dimension.
torch::Tensor EmulatedCouplingForward(const torch::Tensor& x, const torch::Tensor& scale,
                                      const torch::Tensor& shift);

// Its backward for g = (g1, g2): dx = (g2 + scale * g1, g1),
// dscale = sum over the batch of g1 * x1, dshift = sum over the batch of g1.
EmulatedGrads EmulatedCouplingBackward(const torch::Tensor& g, const torch::Tensor& x,
                                       const torch::Tensor& scale, bool input, bool weights);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_EMULATED_KERNELS_H_
