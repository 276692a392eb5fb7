#include "worker/algorithms/weight_version.h"

namespace stagewise::worker {

WeightVersion WeightVersion::Take(const std::vector<torch::Tensor>& params) {
  WeightVersion v;
  torch::NoGradGuard no_grad;
  v.values_.reserve(params.size());
  v.counters_.reserve(params.size());
  for (const auto& p : params) {
    v.values_.push_back(p.detach().clone());
    v.counters_.emplace_back(/*version=*/0);
  }
  return v;
}

int64_t WeightVersion::bytes() const {
  int64_t n = 0;
  for (const auto& t : values_) n += static_cast<int64_t>(t.numel() * t.element_size());
  return n;
}

WeightVersion::InUse::InUse(WeightVersion& version, std::vector<torch::Tensor>& params)
    : params_(params) {
  TORCH_CHECK(version.values_.size() == params.size(),
              "WeightVersion: taken of another parameter list");
  live_.reserve(params.size());
  counters_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    c10::TensorImpl* impl = params[i].unsafeGetTensorImpl();
    live_.push_back(params[i].variable_data());  // shares the storage, not the counter
    counters_.push_back(impl->version_counter());
    // set_data keeps the tensor's counter, so the version's goes in after it.
    params[i].set_data(version.values_[i]);
    impl->set_version_counter(version.counters_[i]);
  }
}

WeightVersion::InUse::~InUse() {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].set_data(live_[i]);
    params_[i].unsafeGetTensorImpl()->set_version_counter(counters_[i]);
  }
}

}  // namespace stagewise::worker
