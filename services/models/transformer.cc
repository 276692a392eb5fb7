#include "services/models/transformer.h"

#include <cmath>

namespace stagewise::models {
namespace {

// GPT-2's initialisation of the embeddings.
constexpr double kEmbeddingStd = 0.02;

torch::nn::LayerNorm Norm(int64_t width) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}));
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(int64_t width, int64_t heads) : heads_(heads) {
  TORCH_CHECK(heads > 0 && width % heads == 0, "attention: ", heads, " heads do not divide width ",
              width);
  qkv_ = register_module("qkv", torch::nn::Linear(width, 3 * width));
  proj_ = register_module("proj", torch::nn::Linear(width, width));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), width = x.size(2);
  const int64_t head = width / heads_;
  // [B, T, 3W] -> three [B, H, T, W/H]
  auto qkv = qkv_->forward(x).view({b, t, 3, heads_, head}).permute({2, 0, 3, 1, 4});
  torch::Tensor q = qkv[0], k = qkv[1], v = qkv[2];
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(head)));
  torch::Tensor future =
      torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor out = torch::matmul(torch::softmax(scores, -1), v);
  return proj_->forward(out.transpose(1, 2).reshape({b, t, width}));
}

AttentionBranchImpl::AttentionBranchImpl(int64_t width, int64_t heads) {
  norm_ = register_module("norm", Norm(width));
  attn_ = register_module("attn", CausalSelfAttention(width, heads));
}

MlpBranchImpl::MlpBranchImpl(int64_t width, int64_t hidden) {
  norm_ = register_module("norm", Norm(width));
  up_ = register_module("up", torch::nn::Linear(width, hidden));
  down_ = register_module("down", torch::nn::Linear(hidden, width));
}

torch::Tensor MlpBranchImpl::forward(const torch::Tensor& x) {
  return down_->forward(torch::gelu(up_->forward(norm_->forward(x))));
}

EmbeddingBlock::EmbeddingBlock(const BlockInfo& info) : Block(info) {
  const int64_t max_length = info.in_shape.at(0);
  tokens_ = register_module("tokens", torch::nn::Embedding(info.in_channels, info.out_channels));
  torch::NoGradGuard no_grad;
  tokens_->weight.normal_(0, kEmbeddingStd);
  positions_ = register_parameter(
      "positions", torch::empty({max_length, info.out_channels}).normal_(0, kEmbeddingStd));
}

torch::Tensor EmbeddingBlock::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "embedding: expected byte values [B, T], got ", x.sizes());
  const int64_t t = x.size(1);
  TORCH_CHECK(t >= 1 && t <= positions_.size(0), "embedding: sequence of ", t,
              " bytes; the model was built for at most ", positions_.size(0),
              " (data.sequence_length)");
  torch::Tensor h = tokens_->forward(x) + positions_.narrow(0, 0, t);
  return info().pair ? torch::cat({h, h}, -1) : h;
}

TransformerBlock::TransformerBlock(const BlockInfo& info) : Block(info) {
  attention_ = register_module("attention", AttentionBranch(info.out_channels, info.heads));
  mlp_ = register_module("mlp", MlpBranch(info.out_channels, info.mid_channels));
}

torch::Tensor TransformerBlock::forward(const torch::Tensor& x) {
  torch::Tensor h = x + attention_->forward(x);
  return h + mlp_->forward(h);
}

ReversibleTransformerBlock::ReversibleTransformerBlock(const BlockInfo& info)
    : ReversibleBlock(info, CustomF{}) {
  attention_ = register_module("attention", AttentionBranch(info.out_channels, info.heads));
  mlp_ = register_module("mlp", MlpBranch(info.out_channels, info.mid_channels));
}

torch::Tensor ReversibleTransformerBlock::forward(const torch::Tensor& x) {
  auto pair = x.chunk(2, -1);
  torch::Tensor y1 = pair[0] + attention_->forward(pair[1]);
  torch::Tensor y2 = pair[1] + mlp_->forward(y1);
  return torch::cat({y1, y2}, -1);
}

torch::Tensor ReversibleTransformerBlock::inverse(const torch::Tensor& y) {
  auto pair = y.chunk(2, -1);
  torch::Tensor x2 = pair[1] - mlp_->forward(pair[0]);
  torch::Tensor x1 = pair[0] - attention_->forward(x2);
  return torch::cat({x1, x2}, -1);
}

torch::Tensor ReversibleTransformerBlock::F(const torch::Tensor&) {
  TORCH_CHECK(false, "rev_transformer: a two-function coupling has no single F");
}

std::pair<torch::Tensor, torch::Tensor> ReversibleTransformerBlock::RebuildBackward(
    const torch::Tensor& y, const torch::Tensor& dy, bool input_grad) {
  // (y1, y2) = (x1 + A(x2), x2 + M(y1)). Going back:
  //   x2 = y2 - M(y1); dy1' = dy1 + (dM/dy1)^T dy2      (M's parameters get dy2)
  //   x1 = y1 - A(x2); dx2 = dy2 + (dA/dx2)^T dy1', dx1 = dy1'  (A's get dy1')
  auto out = y.chunk(2, -1);
  auto dout = dy.chunk(2, -1);
  torch::Tensor y1 = out[0].detach().requires_grad_(true);
  torch::Tensor m = mlp_->forward(y1);
  torch::Tensor x2;
  {
    torch::NoGradGuard no_grad;
    x2 = out[1] - m;
  }
  m.backward(dout[1]);
  torch::Tensor dy1 = dout[0] + y1.grad();
  torch::Tensor x2_in = x2.detach().requires_grad_(input_grad);
  torch::Tensor a = attention_->forward(x2_in);
  torch::Tensor x1;
  {
    torch::NoGradGuard no_grad;
    x1 = out[0] - a;
  }
  a.backward(dy1);
  torch::Tensor rebuilt = torch::cat({x1, x2}, -1);
  torch::Tensor dx;
  if (input_grad) dx = torch::cat({dy1, dout[1] + x2_in.grad()}, -1);
  return {rebuilt, dx};
}

LmHeadBlock::LmHeadBlock(const BlockInfo& info) : Block(info) {
  norm_ = register_module("norm", Norm(info.in_channels));
  fc_ = register_module("fc", torch::nn::Linear(info.in_channels, info.out_channels));
}

torch::Tensor LmHeadBlock::forward(const torch::Tensor& x) {
  return fc_->forward(norm_->forward(x));
}

}  // namespace stagewise::models
