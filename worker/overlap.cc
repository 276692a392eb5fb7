#include "worker/overlap.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace stagewise::worker {

// Runs after a parameter's gradient accumulator has added this backward's
// gradient into .grad.
class OverlappedAverage::Hook : public torch::autograd::FunctionPostHook {
 public:
  Hook(OverlappedAverage* owner, int index) : owner_(owner), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    (void)inputs;
    owner_->Ready(index_);
    return outputs;
  }
  const OverlappedAverage* owner() const { return owner_; }

 private:
  OverlappedAverage* const owner_;
  const int index_;
};

OverlappedAverage::OverlappedAverage(ReplicaGroup* group, std::vector<torch::Tensor> params,
                                     int64_t bucket_bytes)
    : group_(group), params_(std::move(params)), bucket_of_(params_.size(), 0) {
  // The reversed list's layout, mapped back to indices into params_.
  const std::vector<torch::Tensor> reversed(params_.rbegin(), params_.rend());
  const int last = static_cast<int>(params_.size()) - 1;
  for (const std::vector<int>& bucket : BucketLayout(reversed, bucket_bytes)) {
    std::vector<int>& members = buckets_.emplace_back();
    for (int r : bucket) {
      members.push_back(last - r);
      bucket_of_[last - r] = static_cast<int>(buckets_.size()) - 1;
    }
  }
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    if (!params_[i].requires_grad()) continue;
    std::shared_ptr<torch::autograd::Node> acc =
        torch::autograd::impl::grad_accumulator(params_[i]);
    if (acc == nullptr) continue;
    acc->add_post_hook(std::make_unique<Hook>(this, i));
    accumulators_.push_back(std::move(acc));
  }
}

OverlappedAverage::~OverlappedAverage() {
  // The accumulators outlive this object when the parameters do: their
  // hooks must not call back into it.
  for (auto& acc : accumulators_) {
    auto& hooks = acc->post_hooks();
    hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                               [this](const std::unique_ptr<torch::autograd::FunctionPostHook>& h) {
                                 auto* hook = dynamic_cast<Hook*>(h.get());
                                 return hook != nullptr && hook->owner() == this;
                               }),
                hooks.end());
  }
}

void OverlappedAverage::Arm() {
  absl::MutexLock lock(&mu_);
  armed_ = true;
  next_ = 0;
  pending_.clear();
  error_ = absl::OkStatus();
  missing_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = static_cast<int>(buckets_[b].size());
  reported_.assign(params_.size(), 0);
}

bool OverlappedAverage::armed() const {
  absl::MutexLock lock(&mu_);
  return armed_;
}

int64_t OverlappedAverage::started_early() const {
  absl::MutexLock lock(&mu_);
  return started_early_;
}

void OverlappedAverage::Ready(int index) {
  absl::MutexLock lock(&mu_);
  if (!armed_ || reported_[index]) return;
  reported_[index] = 1;
  --missing_[bucket_of_[index]];
  const int before = next_;
  StartInOrder(/*all=*/false);
  started_early_ += next_ - before;
}

void OverlappedAverage::StartInOrder(bool all) {
  while (error_.ok() && next_ < static_cast<int>(buckets_.size()) &&
         (all || missing_[next_] == 0)) {
    std::vector<torch::Tensor> grads;
    for (int i : buckets_[next_]) {
      const torch::Tensor& p = params_[i];
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
    absl::StatusOr<ReplicaGroup::Pending> started = group_->StartSum(std::move(grads));
    if (!started.ok()) {
      error_ = started.status();
      return;
    }
    pending_.push_back(*std::move(started));
    ++next_;
  }
}

absl::Status OverlappedAverage::Finish() {
  const absl::Time start = absl::Now();
  std::vector<ReplicaGroup::Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    if (!armed_) return absl::FailedPreconditionError("OverlappedAverage::Finish without Arm");
    armed_ = false;
    StartInOrder(/*all=*/true);
    if (!error_.ok()) return error_;
    pending = std::move(pending_);
    pending_.clear();
  }
  return group_->FinishSums(pending, 1.0 / group_->size(), start);
}

}  // namespace stagewise::worker
