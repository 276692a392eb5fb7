#include "services/models/aux_net.h"

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/models/model.h"

namespace stagewise::models {
namespace {

torch::nn::Conv2d Conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

AuxNetImpl::AuxNetImpl(AuxNetArch kind, const std::vector<int64_t>& in_shape,
                       const std::vector<int64_t>& out_shape, int blocks)
    : out_shape_(out_shape), image_(in_shape.size() == 3 && out_shape.size() == 3) {
  if (!image_) {
    linear_ = register_module("linear", torch::nn::Linear(Numel(in_shape), Numel(out_shape)));
    return;
  }
  const int64_t stride = std::max<int64_t>(1, in_shape[1] / std::max<int64_t>(1, out_shape[1]));
  torch::nn::Sequential stem;
  stem->push_back(Conv3x3(in_shape[0], out_shape[0], stride));
  stem->push_back(BatchNorm(out_shape[0]));
  stem->push_back(torch::nn::ReLU());
  stem_ = register_module("stem", stem);
  for (int b = 0; kind == AuxNetArch::kResnet && b < blocks; ++b) {
    torch::nn::Sequential body;
    body->push_back(Conv3x3(out_shape[0], out_shape[0], 1));
    body->push_back(BatchNorm(out_shape[0]));
    body->push_back(torch::nn::ReLU());
    body->push_back(Conv3x3(out_shape[0], out_shape[0], 1));
    body->push_back(BatchNorm(out_shape[0]));
    bodies_.push_back(register_module(b == 0 ? "body" : absl::StrCat("body_", b), body));
  }
}

torch::Tensor AuxNetImpl::forward(const torch::Tensor& x) {
  if (!image_) {
    std::vector<int64_t> shape = {x.size(0)};
    shape.insert(shape.end(), out_shape_.begin(), out_shape_.end());
    return linear_->forward(x.flatten(1)).reshape(shape);
  }
  torch::Tensor h = stem_->forward(x);
  if (h.size(2) != out_shape_[1] || h.size(3) != out_shape_[2]) {
    h = torch::adaptive_avg_pool2d(h, {out_shape_[1], out_shape_[2]});
  }
  for (auto& body : bodies_) h = torch::relu(h + body->forward(h));
  return h;
}

absl::StatusOr<AuxNet> MakeAuxNet(AuxNetArch kind, const std::vector<int64_t>& in_shape,
                                  const std::vector<int64_t>& out_shape, uint64_t seed,
                                  int blocks) {
  if (blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm.auxnet_blocks: ", blocks, " (at least 1)"));
  }
  AuxNet net{nullptr};
  WithInitSeed(seed, [&] { net = AuxNet(kind, in_shape, out_shape, blocks); });
  return net;
}

uint64_t AuxNetSeed(uint64_t job_seed, int first_block) {
  return BlockSeed(job_seed ^ 0xA0E7ULL, 200000 + first_block);
}

}  // namespace stagewise::models
