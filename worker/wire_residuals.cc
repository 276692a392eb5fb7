#include "worker/wire_residuals.h"

#include <torch/torch.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stagewise::worker {

torch::Tensor* WireResiduals::Slot(int micro_batch) {
  absl::MutexLock lock(&mu_);
  return &slots_[micro_batch];
}

bool WireResiduals::Save(torch::serialize::OutputArchive& archive) {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> ids;
  for (const auto& [slot, residual] : slots_) {
    if (!residual.defined()) continue;
    ids.push_back(slot);
    archive.write(absl::StrCat("slot", slot), residual.detach().cpu());
  }
  if (ids.empty()) return false;
  archive.write("slots", torch::tensor(ids, torch::kLong));
  return true;
}

absl::Status WireResiduals::Load(torch::serialize::InputArchive& archive, torch::Device device) {
  torch::Tensor ids;
  if (!archive.try_read("slots", ids) || ids.dim() != 1 || ids.scalar_type() != torch::kLong) {
    return absl::DataLossError("error feedback: no list of slots");
  }
  std::map<int, torch::Tensor> slots;
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const auto slot = static_cast<int>(ids[i].item<int64_t>());
    torch::Tensor residual;
    if (!archive.try_read(absl::StrCat("slot", slot), residual)) {
      return absl::DataLossError(absl::StrCat("error feedback: slot ", slot, " missing"));
    }
    slots[slot] = residual.to(device);
  }
  absl::MutexLock lock(&mu_);
  slots_ = std::move(slots);
  return absl::OkStatus();
}

int WireResiduals::Count() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [slot, residual] : slots_) n += residual.defined() ? 1 : 0;
  return n;
}

}  // namespace stagewise::worker
