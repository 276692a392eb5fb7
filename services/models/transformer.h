// The text models' blocks (docs/text.md): a byte embedding with learned
// positions, pre-LayerNorm causal Transformer blocks, their reversible
// two-function coupling (the Reformer's), and a language-model head.
// Activations are [B, T, width] (two streams side by side for the reversible
// model: [B, T, 2 x width]); inputs are byte values, int64 [B, T]; the head
// scores the next byte at every position, [B, T, 256]. Any T up to the
// sequence length the model was built for goes through, so micro-batches of
// different lengths share one model.
#ifndef STAGEWISE_SERVICES_MODELS_TRANSFORMER_H_
#define STAGEWISE_SERVICES_MODELS_TRANSFORMER_H_

#include <torch/torch.h>

#include <utility>

#include "services/models/blocks.h"

namespace stagewise::models {

// Multi-head causal self-attention: position t attends to positions <= t.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t width, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t heads_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

// LayerNorm, then attention: the first residual function of a block.
class AttentionBranchImpl : public torch::nn::Module {
 public:
  AttentionBranchImpl(int64_t width, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x) { return attn_->forward(norm_->forward(x)); }

 private:
  torch::nn::LayerNorm norm_{nullptr};
  CausalSelfAttention attn_{nullptr};
};
TORCH_MODULE(AttentionBranch);

// LayerNorm, then width -> hidden -> width with GELU: the second function.
class MlpBranchImpl : public torch::nn::Module {
 public:
  MlpBranchImpl(int64_t width, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear up_{nullptr}, down_{nullptr};
};
TORCH_MODULE(MlpBranch);

// Byte + position embedding (the stem). With info.pair, the sum is repeated
// as the two streams of the reversible model.
class EmbeddingBlock : public Block {
 public:
  explicit EmbeddingBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::nn::Embedding tokens_{nullptr};
  torch::Tensor positions_;
};

// GPT block: h = x + Attention(LN(x)), y = h + MLP(LN(h)).
class TransformerBlock : public Block {
 public:
  explicit TransformerBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  AttentionBranch attention_{nullptr};
  MlpBranch mlp_{nullptr};
};

// The Reformer's reversible block on streams (x1, x2), split on the last
// dimension: y1 = x1 + Attention(x2), y2 = x2 + MLP(y1). Inverse:
// x2 = y2 - MLP(y1), x1 = y1 - Attention(x2).
class ReversibleTransformerBlock : public ReversibleBlock {
 public:
  explicit ReversibleTransformerBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor inverse(const torch::Tensor& y) override;
  // Two functions, not one: F alone is not this block's coupling.
  torch::Tensor F(const torch::Tensor& stream) override;
  // Rebuilds x from y evaluating MLP and Attention once each, and
  // back-propagates dy through both (parameter gradients accumulate).
  std::pair<torch::Tensor, torch::Tensor> RebuildBackward(const torch::Tensor& y,
                                                          const torch::Tensor& dy,
                                                          bool input_grad) override;

 private:
  AttentionBranch attention_{nullptr};
  MlpBranch mlp_{nullptr};
};

// Final LayerNorm and the projection to one score per byte value.
class LmHeadBlock : public Block {
 public:
  explicit LmHeadBlock(const BlockInfo& info);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear fc_{nullptr};
};

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_TRANSFORMER_H_
