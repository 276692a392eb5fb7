#include "worker/outer_sync.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"

namespace stagewise::worker {
namespace {

torch::Tensor Scalar(int64_t v) { return torch::tensor(v, torch::kInt64); }

}  // namespace

absl::Status OuterSync::BeforeStep(const std::vector<torch::Tensor>& params) {
  if (!anchors_.empty() || params.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  if (!loaded_anchors_.empty()) {
    if (loaded_anchors_.size() != params.size() || loaded_momentum_.size() != params.size()) {
      return absl::DataLossError(absl::StrCat("checkpoint outer_sync: ", loaded_anchors_.size(),
                                              " anchors for ", params.size(), " parameters"));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (!loaded_anchors_[i].sizes().equals(params[i].sizes()) ||
          !loaded_momentum_[i].sizes().equals(params[i].sizes())) {
        return absl::DataLossError(absl::StrCat("checkpoint outer_sync: anchor ", i, " has shape ",
                                                c10::str(loaded_anchors_[i].sizes()),
                                                ", the parameter ", c10::str(params[i].sizes())));
      }
      anchors_.push_back(loaded_anchors_[i].to(params[i].options()));
      momentum_.push_back(loaded_momentum_[i].to(params[i].options()));
    }
    loaded_anchors_.clear();
    loaded_momentum_.clear();
    return absl::OkStatus();
  }
  for (const torch::Tensor& p : params) {
    anchors_.push_back(p.detach().clone());
    momentum_.push_back(torch::zeros_like(p));
  }
  return absl::OkStatus();
}

absl::Status OuterSync::AfterStep(const std::vector<torch::Tensor>& params,
                                  const Average& average) {
  if (anchors_.size() != params.size()) {
    return absl::InternalError(absl::StrCat("outer sync: ", anchors_.size(), " anchors for ",
                                            params.size(), " parameters"));
  }
  ++steps_;
  if (spec_.every < 1 || steps_ % spec_.every != 0) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> deltas;
  deltas.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) deltas.push_back(anchors_[i] - params[i].detach());
  STAGEWISE_RETURN_IF_ERROR(average(deltas));
  const double mu = spec_.momentum;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor update = deltas[i];
    if (mu > 0) {
      momentum_[i].mul_(mu).add_(deltas[i]);
      update =
          spec_.outer == OuterOptimizer::kNesterov ? deltas[i].add(momentum_[i], mu) : momentum_[i];
    }
    anchors_[i].sub_(update, spec_.lr);
    params[i].detach().copy_(anchors_[i]);
  }
  return absl::OkStatus();
}

void OuterSync::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("steps", Scalar(steps_));
  archive.write("count", Scalar(static_cast<int64_t>(anchors_.size())));
  for (size_t i = 0; i < anchors_.size(); ++i) {
    archive.write(absl::StrCat("anchor_", i), anchors_[i]);
    archive.write(absl::StrCat("momentum_", i), momentum_[i]);
  }
}

absl::Status OuterSync::Load(torch::serialize::InputArchive& archive) {
  torch::Tensor steps, count;
  if (!archive.try_read("steps", steps) || !archive.try_read("count", count)) {
    return absl::DataLossError("checkpoint outer_sync: no step count");
  }
  steps_ = steps.item<int64_t>();
  anchors_.clear();
  momentum_.clear();
  loaded_anchors_.clear();
  loaded_momentum_.clear();
  for (int64_t i = 0; i < count.item<int64_t>(); ++i) {
    torch::Tensor a, m;
    if (!archive.try_read(absl::StrCat("anchor_", i), a) ||
        !archive.try_read(absl::StrCat("momentum_", i), m)) {
      return absl::DataLossError(absl::StrCat("checkpoint outer_sync: anchor ", i, " missing"));
    }
    loaded_anchors_.push_back(std::move(a));
    loaded_momentum_.push_back(std::move(m));
  }
  return absl::OkStatus();
}

}  // namespace stagewise::worker
