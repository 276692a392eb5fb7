#include "services/models/emulated_kernels.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace stagewise::models {
namespace {

// Values per task when a pass is split across threads (each task walks the
// whole batch for its values, so that the batch sums need no merging).
constexpr int64_t kGrain = 16384;

// Elements from one sample of `t` to the next when each sample's values are
// contiguous (a contiguous tensor, or a slice of one along dimension 1, as a
// reversible block's halves are), or -1.
int64_t SampleStride(const torch::Tensor& t) {
  int64_t per_sample = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != per_sample) return -1;
    per_sample *= t.size(d);
  }
  if (t.size(0) <= 1) return per_sample;
  return t.stride(0) >= per_sample ? t.stride(0) : -1;
}

// Whether the fused loops apply: float32 CPU tensors, activations whose
// samples are each contiguous (SampleStride) with `values * per_value`
// elements, and contiguous scale-like tensors of `values` elements.
bool Fusable(const torch::Tensor& act, std::initializer_list<const torch::Tensor*> params,
             int64_t per_value) {
  auto plain = [](const torch::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32 &&
           !t.is_neg() && !t.is_conj();
  };
  if (!plain(act) || act.dim() < 1 || SampleStride(act) < 0) return false;
  const int64_t n = act.size(0);
  const int64_t values = (*params.begin())->numel();
  for (const torch::Tensor* p : params) {
    if (!plain(*p) || !p->is_contiguous() || p->numel() != values) return false;
  }
  return n > 0 && values > 0 && act.numel() == n * values * per_value;
}

// y = shift + scale * x (+ x) for n samples of `values`; x advances by
// `stride` per sample, y by `values`.
template <bool kResidual>
void AffineForwardLoop(const float* x, int64_t stride, const float* scale, const float* shift,
                       float* y, int64_t n, int64_t values) {
  at::parallel_for(0, values, kGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * stride;
      float* yi = y + i * values;
      for (int64_t k = k0; k < k1; ++k) {
        float v = shift[k] + xi[k] * scale[k];
        if (kResidual) v += xi[k];
        yi[k] = v;
      }
    }
  });
}

// Where one operand of a fused loop is: its first value, and the elements
// from one sample to the next.
struct Strided {
  const float* data;
  int64_t stride;
};

// The backward of shift + scale * a (+ a) for values [k0, k1) of every
// sample: da (when `ga`, advancing by `ga_stride` per sample), and the batch
// sums of g * a and g (when `gs`).
template <bool kResidual>
void AffineBackwardRange(Strided g, Strided a, const float* scale, float* ga, int64_t ga_stride,
                         float* gs, float* gb, int64_t n, int64_t k0, int64_t k1) {
  for (int64_t i = 0; i < n; ++i) {
    const float* gi = g.data + i * g.stride;
    if (ga != nullptr) {
      float* gai = ga + i * ga_stride;
      for (int64_t k = k0; k < k1; ++k) {
        float v = gi[k] * scale[k];
        if (kResidual) v += gi[k];
        gai[k] = v;
      }
    }
    if (gs != nullptr) {
      const float* ai = a.data + i * a.stride;
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
  if (input) out.x = torch::empty(g.sizes(), g.options());  // contiguous
  if (weights) {
    out.scale = torch::zeros_like(scale);
    out.shift = torch::zeros_like(scale);
  }
  return out;
}

}  // namespace

torch::Tensor EmulatedAffineForward(const torch::Tensor& x, const torch::Tensor& scale,
                                    const torch::Tensor& shift, bool residual) {
  const torch::Tensor s = scale.contiguous(), b = shift.contiguous();
  if (!Fusable(x, {&s, &b}, 1)) {
    torch::Tensor y = torch::addcmul(shift, x, scale);
    if (residual) y.add_(x);
    return y;
  }
  torch::Tensor y = torch::empty(x.sizes(), x.options());  // contiguous
  const int64_t n = x.size(0), values = s.numel(), stride = SampleStride(x);
  if (residual) {
    AffineForwardLoop<true>(x.data_ptr<float>(), stride, s.data_ptr<float>(), b.data_ptr<float>(),
                            y.data_ptr<float>(), n, values);
  } else {
    AffineForwardLoop<false>(x.data_ptr<float>(), stride, s.data_ptr<float>(), b.data_ptr<float>(),
                             y.data_ptr<float>(), n, values);
  }
  return y;
}

EmulatedGrads EmulatedAffineBackward(const torch::Tensor& g, const torch::Tensor& x,
                                     const torch::Tensor& scale, bool residual, bool input,
                                     bool weights) {
  EmulatedGrads out;
  const torch::Tensor s = scale.contiguous();
  if (!Fusable(g, {&s}, 1) || !Fusable(x, {&s}, 1) || g.sizes() != x.sizes()) {
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
  out = FusedOutputs(g, s, input, weights);
  float* ga = input ? out.x.data_ptr<float>() : nullptr;
  float* gs = weights ? out.scale.data_ptr<float>() : nullptr;
  float* gb = weights ? out.shift.data_ptr<float>() : nullptr;
  const int64_t n = g.size(0), values = s.numel();
  const Strided gp{g.data_ptr<float>(), SampleStride(g)}, xp{x.data_ptr<float>(), SampleStride(x)};
  at::parallel_for(0, values, kGrain, [&](int64_t k0, int64_t k1) {
    if (residual) {
      AffineBackwardRange<true>(gp, xp, s.data_ptr<float>(), ga, values, gs, gb, n, k0, k1);
    } else {
      AffineBackwardRange<false>(gp, xp, s.data_ptr<float>(), ga, values, gs, gb, n, k0, k1);
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
      AffineBackwardRange<false>({gp, 2 * values}, {xc.data_ptr<float>(), 2 * values}, sp, nullptr,
                                 0, gs, gb, n, k0, k1);
    }
  });
  return out;
}

}  // namespace stagewise::models
