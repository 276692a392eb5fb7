#include "services/models/emulated_kernels.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace stagewise::models {
namespace {

// Values per task when a pass is split across threads (each task walks the
// whole batch for its values, so that the batch sums need no merging).
constexpr int64_t kGrain = 16384;

// Whether the fused loops apply: float32 CPU tensors, contiguous (the caller
// made them so), scale-like tensors of `values` elements, and activations of
// `values * per_value` elements per sample.
bool Fusable(const torch::Tensor& act, std::initializer_list<const torch::Tensor*> params,
             int64_t per_value) {
  auto plain = [](const torch::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32 &&
           t.is_contiguous() && !t.is_neg() && !t.is_conj();
  };
  if (!plain(act) || act.dim() < 1) return false;
  const int64_t n = act.size(0);
  const int64_t values = (*params.begin())->numel();
  for (const torch::Tensor* p : params) {
    if (!plain(*p) || p->numel() != values) return false;
  }
  return n > 0 && values > 0 && act.numel() == n * values * per_value;
}

template <bool kResidual>
void AffineForwardLoop(const float* x, const float* scale, const float* shift, float* y, int64_t n,
                       int64_t values) {
  at::parallel_for(0, values, kGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * values;
      float* yi = y + i * values;
      for (int64_t k = k0; k < k1; ++k) {
        float v = shift[k] + xi[k] * scale[k];
        if (kResidual) v += xi[k];
        yi[k] = v;
      }
    }
  });
}

// The backward of shift + scale * a (+ a) for values [k0, k1) of every
// sample: da (when `ga`), and the batch sums of g * a and g (when `gs`).
// `g`, `a` and `ga` advance by `stride` per sample.
template <bool kResidual>
void AffineBackwardRange(const float* g, const float* a, const float* scale, float* ga, float* gs,
                         float* gb, int64_t n, int64_t stride, int64_t k0, int64_t k1) {
  for (int64_t i = 0; i < n; ++i) {
    const float* gi = g + i * stride;
    if (ga != nullptr) {
      float* gai = ga + i * stride;
      for (int64_t k = k0; k < k1; ++k) {
        float v = gi[k] * scale[k];
        if (kResidual) v += gi[k];
        gai[k] = v;
      }
    }
    if (gs != nullptr) {
      const float* ai = a + i * stride;
      for (int64_t k = k0; k < k1; ++k) {
        gs[k] += gi[k] * ai[k];
        gb[k] += gi[k];
      }
    }
  }
}

// The fused backward's outputs: dx like g (when `input`), zeroed batch sums
// like the scale (when `weights`).
EmulatedGrads FusedOutputs(const torch::Tensor& g, const torch::Tensor& scale, bool input,
                           bool weights) {
  EmulatedGrads out;
  if (input) out.x = torch::empty_like(g);
  if (weights) {
    out.scale = torch::zeros_like(scale);
    out.shift = torch::zeros_like(scale);
  }
  return out;
}

}  // namespace

torch::Tensor EmulatedAffineForward(const torch::Tensor& x, const torch::Tensor& scale,
                                    const torch::Tensor& shift, bool residual) {
  const torch::Tensor in = x.contiguous();
  const torch::Tensor s = scale.contiguous(), b = shift.contiguous();
  if (!Fusable(in, {&s, &b}, 1)) {
    torch::Tensor y = torch::addcmul(shift, x, scale);
    if (residual) y.add_(x);
    return y;
  }
  torch::Tensor y = torch::empty_like(in);
  const int64_t n = in.size(0), values = s.numel();
  if (residual) {
    AffineForwardLoop<true>(in.data_ptr<float>(), s.data_ptr<float>(), b.data_ptr<float>(),
                            y.data_ptr<float>(), n, values);
  } else {
    AffineForwardLoop<false>(in.data_ptr<float>(), s.data_ptr<float>(), b.data_ptr<float>(),
                             y.data_ptr<float>(), n, values);
  }
  return y;
}

EmulatedGrads EmulatedAffineBackward(const torch::Tensor& g, const torch::Tensor& x,
                                     const torch::Tensor& scale, bool residual, bool input,
                                     bool weights) {
  EmulatedGrads out;
  const torch::Tensor gc = g.contiguous(), xc = x.contiguous(), s = scale.contiguous();
  if (!Fusable(gc, {&s}, 1) || !Fusable(xc, {&s}, 1) || gc.sizes() != xc.sizes()) {
    if (input) {
      out.x = g * scale;
      if (residual) out.x.add_(g);
    }
    if (weights) {
      out.scale = (g * x).sum(0);
      out.shift = g.sum(0);
    }
    return out;
  }
  out = FusedOutputs(gc, s, input, weights);
  float* ga = input ? out.x.data_ptr<float>() : nullptr;
  float* gs = weights ? out.scale.data_ptr<float>() : nullptr;
  float* gb = weights ? out.shift.data_ptr<float>() : nullptr;
  const int64_t n = gc.size(0), values = s.numel();
  at::parallel_for(0, values, kGrain, [&](int64_t k0, int64_t k1) {
    if (residual) {
      AffineBackwardRange<true>(gc.data_ptr<float>(), xc.data_ptr<float>(), s.data_ptr<float>(), ga,
                                gs, gb, n, values, k0, k1);
    } else {
      AffineBackwardRange<false>(gc.data_ptr<float>(), xc.data_ptr<float>(), s.data_ptr<float>(),
                                 ga, gs, gb, n, values, k0, k1);
    }
  });
  return out;
}

torch::Tensor EmulatedCouplingForward(const torch::Tensor& x, const torch::Tensor& scale,
                                      const torch::Tensor& shift) {
  const torch::Tensor in = x.contiguous();
  const torch::Tensor s = scale.contiguous(), b = shift.contiguous();
  const int64_t c = in.size(1) / 2;
  torch::Tensor y = torch::empty_like(in);
  if (!Fusable(in, {&s, &b}, 2)) {
    const torch::Tensor x1 = in.narrow(1, 0, c);
    torch::Tensor y1 = y.narrow(1, 0, c);
    torch::addcmul_out(y1, shift, x1, scale);
    y1.add_(in.narrow(1, c, c));
    y.narrow(1, c, c).copy_(x1);
    return y;
  }
  const int64_t n = in.size(0), values = s.numel();
  const float* xp = in.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, values, kGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t i = 0; i < n; ++i) {
      const float* x1 = xp + 2 * i * values;
      const float* x2 = x1 + values;
      float* y1 = yp + 2 * i * values;
      float* y2 = y1 + values;
      for (int64_t k = k0; k < k1; ++k) {
        y1[k] = (bp[k] + x1[k] * sp[k]) + x2[k];
        y2[k] = x1[k];
      }
    }
  });
  return y;
}

EmulatedGrads EmulatedCouplingBackward(const torch::Tensor& g, const torch::Tensor& x,
                                       const torch::Tensor& scale, bool input, bool weights) {
  EmulatedGrads out;
  const torch::Tensor gc = g.contiguous(), xc = x.contiguous(), s = scale.contiguous();
  const int64_t c = gc.size(1) / 2;
  if (!Fusable(gc, {&s}, 2) || !Fusable(xc, {&s}, 2) || gc.sizes() != xc.sizes()) {
    const torch::Tensor g1 = gc.narrow(1, 0, c);
    if (input) {
      out.x = torch::empty_like(gc);
      torch::Tensor gx1 = out.x.narrow(1, 0, c);
      torch::mul_out(gx1, g1, scale);
      gx1.add_(gc.narrow(1, c, c));
      out.x.narrow(1, c, c).copy_(g1);
    }
    if (weights) {
      out.scale = (g1 * xc.narrow(1, 0, c)).sum(0);
      out.shift = g1.sum(0);
    }
    return out;
  }
  out = FusedOutputs(gc, s, input, weights);
  const int64_t n = gc.size(0), values = s.numel();
  const float* gp = gc.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  float* ga = input ? out.x.data_ptr<float>() : nullptr;
  float* gs = weights ? out.scale.data_ptr<float>() : nullptr;
  float* gb = weights ? out.shift.data_ptr<float>() : nullptr;
  at::parallel_for(0, values, kGrain, [&](int64_t k0, int64_t k1) {
    // dx1 = g2 + scale * g1 and dx2 = g1, per sample; the sums over g1 and x1.
    if (ga != nullptr) {
      for (int64_t i = 0; i < n; ++i) {
        const float* g1 = gp + 2 * i * values;
        const float* g2 = g1 + values;
        float* d1 = ga + 2 * i * values;
        float* d2 = d1 + values;
        for (int64_t k = k0; k < k1; ++k) {
          d1[k] = g1[k] * sp[k] + g2[k];
          d2[k] = g1[k];
        }
      }
    }
    if (gs != nullptr) {
      AffineBackwardRange<false>(gp, xc.data_ptr<float>(), sp, nullptr, gs, gb, n, 2 * values, k0,
                                 k1);
    }
  });
  return out;
}

}  // namespace stagewise::models
