#include "services/models/blocks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <sys/prctl.h>

#include <chrono>
#include <memory>
#include <thread>

#include "services/models/emulated_kernels.h"
#include "services/models/transformer.h"

namespace stagewise::models {
namespace {

using Clock = std::chrono::steady_clock;

thread_local double emulated_speed = 1.0;
thread_local const std::atomic<double>* emulated_source = nullptr;  // wins when set

// Waits until `start + seconds`: the time the emulated work would have taken
// from `start`, whatever the real arithmetic cost (on this thread's emulated
// device: EmulatedSeconds). The thread's timer slack drops to 1 us so that
// sub-millisecond waits do not round up by 50 us each.
void WaitUntil(Clock::time_point start, double seconds) {
  static thread_local const bool kFineSlack = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
  (void)kFineSlack;
  seconds = EmulatedSeconds(seconds);
  if (seconds <= 0) return;
  std::this_thread::sleep_until(
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

}  // namespace

// While a DeferredWaits is alive on a thread, the emulated waits there add up
// in it instead of sleeping, and it waits their sum from the start of the
// first of them when it ends (or is flushed): a reversible block's rebuild and
// inverse then count their coupling's arithmetic (a split, a subtraction, a
// concatenation) inside the block's time, and a stage's compute thread
// (EmulatedWaitWindow) the CPU work around its blocks, as an accelerator's
// time would, not on top of it. Nested, the inner one adds its waits to the
// outer one.

class DeferredWaits;
namespace {
thread_local DeferredWaits* deferred = nullptr;
}  // namespace

class DeferredWaits {
 public:
  // `from_now`: the waits count from now (a reversible block's pass); else
  // from the start of the first emulated op added (a compute thread's window,
  // which also holds time spent blocked before it).
  explicit DeferredWaits(bool from_now) : previous_(deferred) {
    deferred = this;
    if (from_now) {
      start_ = Clock::now();
      started_ = true;
    }
  }
  ~DeferredWaits() {
    deferred = previous_;
    if (previous_ != nullptr) {
      if (seconds_ > 0) previous_->Add(start_, seconds_);
    } else {
      WaitUntil(start_, seconds_);
    }
  }
  DeferredWaits(const DeferredWaits&) = delete;
  DeferredWaits& operator=(const DeferredWaits&) = delete;

  void Add(Clock::time_point start, double seconds) {
    if (!started_ || start < start_) start_ = start;
    started_ = true;
    seconds_ += seconds;
  }
  // Waits what was added, from its start; true when there was a wait.
  bool Flush() {
    const bool waited = seconds_ > 0;
    if (waited) WaitUntil(start_, seconds_);
    seconds_ = 0;
    started_ = false;
    return waited;
  }

 private:
  DeferredWaits* const previous_;
  Clock::time_point start_{};
  bool started_ = false;
  double seconds_ = 0;
};

namespace {

// WaitUntil, or the wait added to the thread's DeferredWaits.
void Wait(Clock::time_point start, double seconds) {
  if (deferred != nullptr) {
    deferred->Add(start, seconds);
    return;
  }
  WaitUntil(start, seconds);
}

// An emulated op's forward on x (inputs x, scale, shift): keeps what its
// backward waits (n samples take n * backward_s, of which `weight_share` is
// the weight gradients) and waits n * forward_s from `start`.
void WaitForward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                 const BlockInfo& info, Clock::time_point start) {
  const auto n = static_cast<double>(x.size(0));
  const double backward_s = info.backward_seconds_per_sample * n;
  ctx->saved_data["x_requires_grad"] = x.requires_grad();
  ctx->saved_data["input_s"] = backward_s * (1 - info.backward_weight_share);
  ctx->saved_data["weight_s"] = backward_s * info.backward_weight_share;
  Wait(start, info.forward_seconds_per_sample * n);
}

// Its backward's wait from `start`: the weight share when the pass wants the
// weights' gradients, the rest when it wants the input's (or x needs none:
// a stage's first block), both for a fused backward.
void WaitBackward(torch::autograd::AutogradContext* ctx, Clock::time_point start) {
  const bool weights = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
  const bool input = ctx->needs_input_grad(0) || !ctx->saved_data["x_requires_grad"].toBool();
  Wait(start, (weights ? ctx->saved_data["weight_s"].toDouble() : 0) +
                  (input || !weights ? ctx->saved_data["input_s"].toDouble() : 0));
}

// y = residual * x + scale * x + shift (scale and shift per value of a
// sample), with the waits of an accelerator: n samples take n * forward_s to
// go forward and n * backward_s to go back, of which the weight gradients are
// `weight_share`. A backward pass that asks only for the input gradient (B of
// a zero-bubble schedule) waits the rest; one that asks only for the
// parameters' (W) waits the weight share; a fused backward waits both (also
// where x needs no gradient: a stage's first block then waits as before).
struct EmulatedAffine : public torch::autograd::Function<EmulatedAffine> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& scale, const torch::Tensor& shift,
                               bool residual, const BlockInfo* info) {
    const Clock::time_point start = Clock::now();
    torch::Tensor y = EmulatedAffineForward(x, scale, shift, residual);
    ctx->save_for_backward({x, scale});
    ctx->saved_data["residual"] = residual;
    WaitForward(ctx, x, *info, start);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Clock::time_point start = Clock::now();
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& scale = saved[1];
    const bool weights = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    EmulatedGrads d =
        EmulatedAffineBackward(grads[0], x, scale, ctx->saved_data["residual"].toBool(),
                               ctx->needs_input_grad(0), weights);
    WaitBackward(ctx, start);
    return {d.x, d.scale, d.shift, torch::Tensor(), torch::Tensor()};
  }
};

// The reversible coupling (x, x~) -> (x~ + F(x), x), F(x) = scale * x + shift,
// as one step whose waits (EmulatedAffine's) start before the split and end
// after the concatenation, forward and backward: on an accelerator those are
// part of the block's time, while on the few cores of a test machine they
// would add a real pass over the activations on top of it. The same numbers as
// the coupling written with chunk, add and cat over EmulatedAffine.
struct EmulatedCoupling : public torch::autograd::Function<EmulatedCoupling> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& scale, const torch::Tensor& shift,
                               const BlockInfo* info) {
    const Clock::time_point start = Clock::now();
    torch::Tensor in = x.contiguous();
    torch::Tensor y = EmulatedCouplingForward(in, scale, shift);
    ctx->save_for_backward({in, scale});
    WaitForward(ctx, x, *info, start);
    return y;
  }

  // dx = (dy~ + scale * dy, dy), dscale = sum_n dy * x, dshift = sum_n dy;
  // a backward asked for the input only (B) or the weights only (W) computes
  // and waits that part, as EmulatedAffine does.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Clock::time_point start = Clock::now();
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& scale = saved[1];
    const bool weights = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    EmulatedGrads d =
        EmulatedCouplingBackward(grads[0], x, scale, ctx->needs_input_grad(0), weights);
    WaitBackward(ctx, start);
    return {d.x, d.scale, d.shift, torch::Tensor()};
  }
};

// A scale and a shift per value of a sample (of one stream when reversible).
// Small random scales keep a deep stack of couplings (which grows like a
// Fibonacci sequence with scale 1) well inside float range.
void RegisterEmulatedParameters(torch::nn::Module& block, const BlockInfo& info,
                                torch::Tensor* scale, torch::Tensor* shift) {
  std::vector<int64_t> shape = info.in_shape;
  if (info.reversible) shape[0] /= 2;
  *scale = block.register_parameter("scale", torch::empty(shape).uniform_(-0.01, 0.01));
  *shift = block.register_parameter("shift", torch::zeros(shape));
}

torch::nn::Conv2d Conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}

}  // namespace

double EmulatedSpeed() {
  if (emulated_source != nullptr) {
    const double s = emulated_source->load(std::memory_order_relaxed);
    if (s > 0) return s;
  }
  return emulated_speed;
}

double EmulatedSeconds(double seconds) { return seconds / EmulatedSpeed(); }

ScopedEmulatedSpeed::ScopedEmulatedSpeed(double speed)
    : previous_(emulated_speed), previous_source_(emulated_source) {
  if (speed > 0) emulated_speed = speed;
  emulated_source = nullptr;
}

ScopedEmulatedSpeed::ScopedEmulatedSpeed(const std::atomic<double>* speed)
    : previous_(emulated_speed), previous_source_(emulated_source) {
  emulated_source = speed;
}

ScopedEmulatedSpeed::~ScopedEmulatedSpeed() {
  emulated_speed = previous_;
  emulated_source = previous_source_;
}

EmulatedWaitWindow::EmulatedWaitWindow()
    : waits_(std::make_unique<DeferredWaits>(/*from_now=*/false)) {}

EmulatedWaitWindow::~EmulatedWaitWindow() = default;

bool FlushEmulatedWaits() { return deferred != nullptr && deferred->Flush(); }

torch::Tensor Block::inverse(const torch::Tensor&) {
  TORCH_CHECK(false, "block ", info_.index, " (", info_.kind, ") is not reversible");
}

int64_t Block::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

ResidualBodyImpl::ResidualBodyImpl(int64_t in, int64_t mid, int64_t out, int64_t stride,
                                   bool bottleneck) {
  torch::nn::Sequential s;
  if (bottleneck) {
    s->push_back(Conv(in, mid, 1, 1));
    s->push_back(BatchNorm(mid));
    s->push_back(torch::nn::ReLU());
    s->push_back(Conv(mid, mid, 3, stride));
    s->push_back(BatchNorm(mid));
    s->push_back(torch::nn::ReLU());
    s->push_back(Conv(mid, out, 1, 1));
    s->push_back(BatchNorm(out));
  } else {
    s->push_back(Conv(in, out, 3, stride));
    s->push_back(BatchNorm(out));
    s->push_back(torch::nn::ReLU());
    s->push_back(Conv(out, out, 3, 1));
    s->push_back(BatchNorm(out));
  }
  layers_ = register_module("layers", s);
}

torch::Tensor ResidualBodyImpl::forward(torch::Tensor x) { return layers_->forward(x); }

LinearBlock::LinearBlock(const BlockInfo& info) : Block(info) {
  linear_ = register_module("linear", torch::nn::Linear(info.in_channels, info.out_channels));
}

torch::Tensor LinearBlock::forward(const torch::Tensor& x) {
  torch::Tensor h = info().flatten ? x.flatten(1) : x;
  h = linear_->forward(h);
  return info().relu ? torch::relu(h) : h;
}

BottleneckBlock::BottleneckBlock(const BlockInfo& info) : Block(info) {
  const bool down = info.kind == "bottleneck_down";
  const int64_t wide = down ? info.in_channels : info.out_channels;
  const int64_t narrow = down ? info.out_channels : info.in_channels;
  torch::Tensor q;
  {
    torch::NoGradGuard no_grad;
    auto generator = at::detail::createCPUGenerator(info.basis_seed);
    q = std::get<0>(at::linalg_qr(torch::randn({wide, narrow}, generator)));  // [wide, narrow]
  }
  weight_ = register_parameter("weight", (down ? q.t() : q).contiguous());
  bias_ = register_parameter("bias", torch::zeros({info.out_channels}));
}

torch::Tensor BottleneckBlock::forward(const torch::Tensor& x) {
  if (x.dim() == 4) {  // [N, C, H, W]: over the channels at every pixel
    return torch::conv2d(x, weight_.unsqueeze(-1).unsqueeze(-1), bias_);
  }
  return torch::nn::functional::linear(x, weight_, bias_);
}

StemBlock::StemBlock(const BlockInfo& info) : Block(info) {
  const int64_t k = info.imagenet_stem ? 7 : 3;
  conv_ = register_module("conv", Conv(info.in_channels, info.out_channels, k, info.stride));
  bn_ = register_module("bn", BatchNorm(info.out_channels));
}

torch::Tensor StemBlock::forward(const torch::Tensor& x) {
  torch::Tensor h = torch::relu(bn_->forward(conv_->forward(x)));
  if (info().imagenet_stem) h = torch::max_pool2d(h, 3, 2, 1);
  return h;
}

ResidualBlock::ResidualBlock(const BlockInfo& info) : Block(info) {
  body_ = register_module("body", ResidualBody(info.in_channels, info.mid_channels,
                                               info.out_channels, info.stride, info.bottleneck));
  if (info.stride != 1 || info.in_channels != info.out_channels) {
    proj_ = register_module("proj", Conv(info.in_channels, info.out_channels, 1, info.stride));
    proj_bn_ = register_module("proj_bn", BatchNorm(info.out_channels));
  }
}

torch::Tensor ResidualBlock::forward(const torch::Tensor& x) {
  torch::Tensor shortcut = proj_ ? proj_bn_->forward(proj_->forward(x)) : x;
  return torch::relu(body_->forward(x) + shortcut);
}

ReversibleBlock::ReversibleBlock(const BlockInfo& info) : Block(info) {
  body_ = register_module("body", ResidualBody(info.out_channels, info.mid_channels,
                                               info.out_channels, 1, info.bottleneck));
}

torch::Tensor ReversibleBlock::forward(const torch::Tensor& x) {
  auto pair = x.chunk(2, 1);
  // y = x~ + F(x), y~ = x
  return torch::cat({pair[1] + F(pair[0]), pair[0]}, 1);
}

std::pair<torch::Tensor, torch::Tensor> ReversibleBlock::RebuildBackward(const torch::Tensor& y,
                                                                         const torch::Tensor& dy,
                                                                         bool input_grad) {
  // (y, y~) = (x~ + F(x), x): x = y~, x~ = y - F(x); then
  // dx~ = dy, dx = dy~ + (dF/dx)^T dy, dtheta = (dF/dtheta)^T dy.
  auto out = y.chunk(2, 1);
  auto dout = dy.chunk(2, 1);
  torch::Tensor a = out[1].detach().requires_grad_(input_grad);
  torch::Tensor fa = F(a);
  // Each half written where it goes (one pass per half, no temporaries).
  const int64_t c = out[0].size(1);
  torch::Tensor rebuilt = torch::empty(y.sizes(), y.options());
  {
    torch::NoGradGuard no_grad;
    rebuilt.narrow(1, 0, c).copy_(out[1]);
    torch::Tensor second = rebuilt.narrow(1, c, c);
    torch::sub_out(second, out[0], fa);
  }
  fa.backward(dout[0]);
  torch::Tensor dx;
  if (input_grad) {
    dx = torch::empty(dy.sizes(), dy.options());
    torch::Tensor first = dx.narrow(1, 0, c);
    torch::add_out(first, dout[1], a.grad());
    dx.narrow(1, c, c).copy_(dout[0]);
  }
  return {rebuilt, dx};
}

torch::Tensor ReversibleBlock::inverse(const torch::Tensor& y) {
  auto pair = y.chunk(2, 1);
  // x = y~, x~ = y - F(y~)
  return torch::cat({pair[1], pair[0] - F(pair[1])}, 1);
}

EmulatedBlock::EmulatedBlock(const BlockInfo& info) : Block(info) {
  RegisterEmulatedParameters(*this, info, &scale_, &shift_);
}

torch::Tensor EmulatedBlock::forward(const torch::Tensor& x) {
  return EmulatedAffine::apply(x, scale_, shift_, /*residual=*/true, &info());
}

EmulatedReversibleBlock::EmulatedReversibleBlock(const BlockInfo& info)
    : ReversibleBlock(info, CustomF{}) {
  RegisterEmulatedParameters(*this, info, &scale_, &shift_);
}

torch::Tensor EmulatedReversibleBlock::F(const torch::Tensor& stream) {
  return EmulatedAffine::apply(stream, scale_, shift_, /*residual=*/false, &info());
}

torch::Tensor EmulatedReversibleBlock::forward(const torch::Tensor& x) {
  return EmulatedCoupling::apply(x, scale_, shift_, &info());
}

torch::Tensor EmulatedReversibleBlock::inverse(const torch::Tensor& y) {
  DeferredWaits waits(/*from_now=*/true);
  return ReversibleBlock::inverse(y);
}

std::pair<torch::Tensor, torch::Tensor> EmulatedReversibleBlock::RebuildBackward(
    const torch::Tensor& y, const torch::Tensor& dy, bool input_grad) {
  DeferredWaits waits(/*from_now=*/true);
  return ReversibleBlock::RebuildBackward(y, dy, input_grad);
}

PairDownsampleBlock::PairDownsampleBlock(const BlockInfo& info) : Block(info) {
  BlockInfo half = info;
  half.kind = "downsample";
  half.pair = false;
  half.in_channels = info.in_channels / 2;
  half.out_channels = info.out_channels / 2;
  first_ = register_module("first", std::make_shared<ResidualBlock>(half));
  proj_ = register_module("proj", Conv(half.in_channels, half.out_channels, 1, info.stride));
  proj_bn_ = register_module("proj_bn", BatchNorm(half.out_channels));
}

torch::Tensor PairDownsampleBlock::forward(const torch::Tensor& x) {
  auto pair = x.chunk(2, 1);
  return torch::cat({first_->forward(pair[0]), proj_bn_->forward(proj_->forward(pair[1]))}, 1);
}

HeadBlock::HeadBlock(const BlockInfo& info) : Block(info) {
  fc_ = register_module("fc", torch::nn::Linear(info.in_channels, info.out_channels));
}

namespace {

// Global average pooling over dimensions 2 and 3 whose backward hands on the
// incoming gradient divided by H * W and expanded (a view: LibTorch's own
// backward writes the quotient into a new tensor of the input's size, a pass
// over the activations). The same values.
struct AveragePool : public torch::autograd::Function<AveragePool> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->saved_data["sizes"] = x.sizes().vec();
    return x.mean({2, 3});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const torch::Tensor g = grads[0] / static_cast<double>(sizes[2] * sizes[3]);
    return {g.unsqueeze(2).unsqueeze(3).expand(sizes)};
  }
};

}  // namespace

torch::Tensor HeadBlock::forward(const torch::Tensor& x) {
  torch::Tensor h = x.dim() == 4 ? AveragePool::apply(x) : x.flatten(1);
  return fc_->forward(h);
}

std::shared_ptr<Block> MakeBlock(const BlockInfo& info) {
  if (info.kind == "linear") return std::make_shared<LinearBlock>(info);
  if (info.kind == "bottleneck_down" || info.kind == "bottleneck_up")
    return std::make_shared<BottleneckBlock>(info);
  if (info.kind == "stem") return std::make_shared<StemBlock>(info);
  if (info.kind == "downsample" && info.pair) return std::make_shared<PairDownsampleBlock>(info);
  if (info.kind == "residual" || info.kind == "downsample")
    return std::make_shared<ResidualBlock>(info);
  if (info.kind == "reversible") return std::make_shared<ReversibleBlock>(info);
  if (info.kind == "head") return std::make_shared<HeadBlock>(info);
  if (info.kind == "emulated" && info.reversible)
    return std::make_shared<EmulatedReversibleBlock>(info);
  if (info.kind == "emulated") return std::make_shared<EmulatedBlock>(info);
  if (info.kind == "embedding") return std::make_shared<EmbeddingBlock>(info);
  if (info.kind == "transformer") return std::make_shared<TransformerBlock>(info);
  if (info.kind == "rev_transformer") return std::make_shared<ReversibleTransformerBlock>(info);
  if (info.kind == "lm_head") return std::make_shared<LmHeadBlock>(info);
  TORCH_CHECK(false, "unknown block kind '", info.kind, "'");
}

}  // namespace stagewise::models
