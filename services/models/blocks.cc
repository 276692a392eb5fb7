#include "services/models/blocks.h"

#include <memory>

namespace stagewise::models {
namespace {

torch::nn::Conv2d Conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}

}  // namespace

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
  return torch::cat({pair[1] + body_->forward(pair[0]), pair[0]}, 1);
}

torch::Tensor ReversibleBlock::inverse(const torch::Tensor& y) {
  auto pair = y.chunk(2, 1);
  // x = y~, x~ = y - F(y~)
  return torch::cat({pair[1], pair[0] - body_->forward(pair[1])}, 1);
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

torch::Tensor HeadBlock::forward(const torch::Tensor& x) {
  torch::Tensor h = x.dim() == 4 ? x.mean({2, 3}) : x.flatten(1);
  return fc_->forward(h);
}

std::shared_ptr<Block> MakeBlock(const BlockInfo& info) {
  if (info.kind == "linear") return std::make_shared<LinearBlock>(info);
  if (info.kind == "stem") return std::make_shared<StemBlock>(info);
  if (info.kind == "downsample" && info.pair) return std::make_shared<PairDownsampleBlock>(info);
  if (info.kind == "residual" || info.kind == "downsample")
    return std::make_shared<ResidualBlock>(info);
  if (info.kind == "reversible") return std::make_shared<ReversibleBlock>(info);
  if (info.kind == "head") return std::make_shared<HeadBlock>(info);
  TORCH_CHECK(false, "unknown block kind '", info.kind, "'");
}

}  // namespace stagewise::models
