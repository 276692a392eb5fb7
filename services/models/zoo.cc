// The model zoo: MLP, ResNet (CIFAR and ImageNet style), RevNet (PETRA).
#include <functional>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/models/model.h"
#include "services/models/script_model.h"

namespace stagewise::models {
namespace {
std::mutex& InitMutex() {
  static std::mutex m;
  return m;
}

}  // namespace

Model::Model(std::vector<std::shared_ptr<Block>> blocks) : blocks_(std::move(blocks)) {
  if (!blocks_.empty()) {
    begin_ = blocks_.front()->info().index;
    end_ = blocks_.back()->info().index + 1;
  }
  for (const auto& b : blocks_) register_module(std::to_string(b->info().index), b);
}

torch::Tensor Model::forward(const torch::Tensor& x) {
  torch::Tensor h = x;
  for (const auto& b : blocks_) h = b->forward(h);
  return h;
}

std::shared_ptr<Model> Model::Slice(int begin, int end) const {
  std::vector<std::shared_ptr<Block>> part;
  for (const auto& b : blocks_) {
    if (b->info().index >= begin && b->info().index < end) part.push_back(b);
  }
  return std::make_shared<Model>(std::move(part));
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const auto& b : blocks_) n += b->num_parameters();
  return n;
}

void WithInitSeed(uint64_t seed, const std::function<void()>& build) {
  std::lock_guard<std::mutex> lock(InitMutex());
  torch::manual_seed(seed);
  build();
}

absl::StatusOr<std::shared_ptr<Model>> BuildModel(const ModelSpec& spec, uint64_t seed, int begin,
                                                  int end) {
  if (spec.name == ModelKind::kTorchScript) {
    // The weights come from the file; any partition holds exactly its blocks.
    auto blocks = LoadScriptBlocks(spec, begin, end);
    if (!blocks.ok()) return blocks.status();
    return std::make_shared<Model>(*std::move(blocks));
  }
  auto plan = PlanModel(spec);
  if (!plan.ok()) return plan.status();
  const int n = static_cast<int>(plan->size());
  if (end < 0) end = n;
  if (begin < 0 || begin >= end || end > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("block range [", begin, ", ", end, ") is outside the model's ", n, " blocks"));
  }
  std::vector<std::shared_ptr<Block>> blocks;
  try {
    // The global generator is shared: build one block at a time under a lock.
    std::lock_guard<std::mutex> lock(InitMutex());
    for (int i = begin; i < end; ++i) {
      torch::manual_seed(BlockSeed(seed, i));
      blocks.push_back(MakeBlock((*plan)[i]));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("building the model: ", e.what()));
  }
  return std::make_shared<Model>(std::move(blocks));
}

}  // namespace stagewise::models
