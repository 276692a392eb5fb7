#include "services/models/aux_head.h"

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/models/model.h"

namespace stagewise::models {

AuxHeadImpl::AuxHeadImpl(const AuxHeadSpec& spec, const std::vector<int64_t>& in_shape,
                         int64_t classes) {
  image_ = in_shape.size() == 3;
  sequence_ = in_shape.size() == 2;
  int64_t channels = 1;
  if (image_) {
    channels = in_shape[0];
  } else if (sequence_) {
    channels = in_shape[1];
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({channels})));
  } else {
    for (int64_t d : in_shape) channels *= d;
  }
  if (!spec.conv_channels.empty()) {
    torch::nn::Sequential s;
    for (int64_t c : spec.conv_channels) {
      s->push_back(torch::nn::Conv2d(
          torch::nn::Conv2dOptions(channels, c, 3).stride(1).padding(1).bias(false)));
      s->push_back(BatchNorm(c));
      s->push_back(torch::nn::ReLU());
      channels = c;
    }
    convs_ = register_module("convs", s);
  }
  fc_ = register_module("fc", torch::nn::Linear(channels, classes));
}

torch::Tensor AuxHeadImpl::forward(const torch::Tensor& x) {
  if (sequence_) return fc_->forward(norm_->forward(x));
  torch::Tensor h = x;
  if (!convs_.is_empty()) h = convs_->forward(h);
  h = image_ ? h.mean({2, 3}) : h.flatten(1);
  return fc_->forward(h);
}

uint64_t AuxHeadSeed(uint64_t job_seed, int last_block) {
  return BlockSeed(job_seed ^ 0xA0C5EEDULL, 100000 + last_block);
}

absl::StatusOr<AuxHead> MakeAuxHead(const AuxHeadSpec& spec, const std::vector<int64_t>& in_shape,
                                    int64_t classes, uint64_t seed) {
  if (!spec.conv_channels.empty() && in_shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.aux_head: a conv head needs image-shaped stage outputs [C,H,W], "
                     "this stage outputs rank ",
                     in_shape.size(), "; use aux_head: linear"));
  }
  AuxHead head{nullptr};
  WithInitSeed(seed, [&] { head = AuxHead(spec, in_shape, classes); });
  return head;
}

}  // namespace stagewise::models
