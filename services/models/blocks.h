// The concrete blocks of the zoo.
#ifndef STAGEWISE_SERVICES_MODELS_BLOCKS_H_
#define STAGEWISE_SERVICES_MODELS_BLOCKS_H_

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <utility>

#include "services/models/batch_norm.h"
#include "services/models/block.h"

namespace stagewise::models {

// The residual function of a ResNet block, without the skip connection:
// basic (conv3x3-BN-ReLU-conv3x3-BN) or bottleneck (1x1-3x3-1x1, stride on 3x3).
class ResidualBodyImpl : public torch::nn::Module {
 public:
  ResidualBodyImpl(int64_t in, int64_t mid, int64_t out, int64_t stride, bool bottleneck);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Sequential layers_{nullptr};
};
TORCH_MODULE(ResidualBody);

// Optional-linear stack for MLPs: [flatten] -> linear -> [ReLU].
class LinearBlock : public Block {
 public:
  explicit LinearBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::nn::Linear linear_{nullptr};
};

// stages.bottleneck: a linear map of the channels at every position (a 1x1
// convolution on [C, H, W], a linear layer on [T, width] or [width]), from
// in_channels to out_channels, no activation. The down- and up-projection
// of a cut start as Q^T and Q for one random Q with orthonormal columns
// (drawn from info.basis_seed), so that together they start as a
// projection; biases start at zero.
class BottleneckBlock : public Block {
 public:
  explicit BottleneckBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::Tensor weight_, bias_;  // [out, in], [out]
};

// Non-reversible input layer: 3x3 conv (small inputs) or 7x7/2 conv + max-pool,
// then BN and ReLU.
class StemBlock : public Block {
 public:
  explicit StemBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::nn::Conv2d conv_{nullptr};
  BatchNorm bn_{nullptr};
};

// ResNet block: ReLU(body(x) + shortcut(x)); the shortcut is a 1x1 conv + BN
// when the shape changes. kind "downsample" when stride > 1.
class ResidualBlock : public Block {
 public:
  explicit ResidualBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  ResidualBody body_{nullptr};
  torch::nn::Conv2d proj_{nullptr};
  BatchNorm proj_bn_{nullptr};
};

// RevNet downsampling on a channel-split pair (x, x~), not reversible:
// y = ResNet downsampling block(x), y~ = BN(conv1x1/2(x~)). Per stream this has
// the parameters of the ResNet block it replaces plus one projection, which
// keeps RevNet parameter counts close to ResNet's (PETRA Tab. 2).
class PairDownsampleBlock : public Block {
 public:
  explicit PairDownsampleBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  std::shared_ptr<ResidualBlock> first_;
  torch::nn::Conv2d proj_{nullptr};
  BatchNorm proj_bn_{nullptr};
};

// Reversible coupling on a channel-split pair (the PETRA paper, Fig. 2;
// docs/models.md, "Blocks"): (x, x~) -> (y, y~) with y = x~ + F(x), y~ = x, where F is a
// residual body on one stream. Inverse: x = y~, x~ = y - F(y~).
// Input and output are the pair concatenated along channels.
class ReversibleBlock : public Block {
 public:
  explicit ReversibleBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor inverse(const torch::Tensor& y) override;
  // The coupling function F, for algorithms that rebuild and differentiate in one go.
  virtual torch::Tensor F(const torch::Tensor& stream) { return body_->forward(stream); }
  // Rebuilds the input from the output y and back-propagates dy through the
  // block (parameter gradients accumulate): {x, dx}, dx only if input_grad.
  // The coupling's version evaluates F once; other reversible blocks override.
  virtual std::pair<torch::Tensor, torch::Tensor> RebuildBackward(const torch::Tensor& y,
                                                                  const torch::Tensor& dy,
                                                                  bool input_grad);

 protected:
  // For couplings whose F is not a residual body (they override F).
  struct CustomF {};
  ReversibleBlock(const BlockInfo& info, CustomF) : Block(info) {}

 private:
  ResidualBody body_{nullptr};
};

// Emulated accelerator work (docs/models.md, "Emulated accelerators"): an
// elementwise affine map y = x + scale * x + shift whose forward and backward
// take the configured time per sample (BlockInfo::*_seconds_per_sample) by
// waiting, not by burning a core. Real tensors and real autograd, so every
// algorithm runs on it unchanged; J such stages on one small machine behave
// like J devices.
class EmulatedBlock : public Block {
 public:
  explicit EmulatedBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::Tensor scale_, shift_;
};

// How fast this thread's emulated device is: emulated blocks wait their
// configured times divided by it (a worker's --emulated-speed: 0.5 is a
// device half as fast). 1 unless a ScopedEmulatedSpeed is alive on the
// thread; LibTorch runs a CPU backward on the thread that calls it, so the
// stage's compute thread (and the profiling thread) set it once.
double EmulatedSpeed();
// The seconds an emulated wait of `seconds` takes on this thread.
double EmulatedSeconds(double seconds);
class ScopedEmulatedSpeed {
 public:
  explicit ScopedEmulatedSpeed(double speed);  // speed > 0
  // The speed as `speed` holds it at each wait: a worker changes it while
  // its stages run (--emulated-speed-file). Must outlive this object.
  explicit ScopedEmulatedSpeed(const std::atomic<double>* speed);
  ~ScopedEmulatedSpeed();
  ScopedEmulatedSpeed(const ScopedEmulatedSpeed&) = delete;
  ScopedEmulatedSpeed& operator=(const ScopedEmulatedSpeed&) = delete;

 private:
  double previous_;
  const std::atomic<double>* previous_source_;
};

// The reversible variant: the coupling (x, x~) -> (x~ + F(x), x) with
// A stage's compute thread keeps one alive while it runs its stage: the
// emulated waits of what it computes add up and are waited out at the next
// FlushEmulatedWaits (each compute span's end, and before a message is sent
// or waited for), counted from the start of the first emulated op since the
// last flush. The CPU work around the emulated blocks in that time (the
// autograd engine, adding a micro-batch's weight gradients to the ones
// accumulated so far) then counts inside the emulated time, as it would
// inside an accelerator's, not on top of it; work beyond the emulated time
// still shows. One per thread at a time; not copyable.
class DeferredWaits;
class EmulatedWaitWindow {
 public:
  EmulatedWaitWindow();
  ~EmulatedWaitWindow();  // waits out what is left
  EmulatedWaitWindow(const EmulatedWaitWindow&) = delete;
  EmulatedWaitWindow& operator=(const EmulatedWaitWindow&) = delete;

 private:
  std::unique_ptr<DeferredWaits> waits_;
};
// Waits out this thread's window (if any) so far; true when it waited.
bool FlushEmulatedWaits();

// F(x) = scale * x + shift, waiting like EmulatedBlock. Its rebuild therefore
// costs one more forward, as a real reversible block's does. The coupling's own
// split, sum and concatenation run inside the waits (forward, backward,
// inverse and rebuild): the configured times are the whole block's, as on an
// accelerator.
class EmulatedReversibleBlock : public ReversibleBlock {
 public:
  explicit EmulatedReversibleBlock(const BlockInfo& info);
  torch::Tensor F(const torch::Tensor& stream) override;
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor inverse(const torch::Tensor& y) override;
  std::pair<torch::Tensor, torch::Tensor> RebuildBackward(const torch::Tensor& y,
                                                          const torch::Tensor& dy,
                                                          bool input_grad) override;

 private:
  torch::Tensor scale_, shift_;
};

// Global average pool (images) + linear classifier; plain linear for vectors.
class HeadBlock : public Block {
 public:
  explicit HeadBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::nn::Linear fc_{nullptr};
};

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_BLOCKS_H_
