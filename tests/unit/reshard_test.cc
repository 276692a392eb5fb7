// Resharding (worker/reshard.h): the shards of one cut regrouped onto
// another hold the same parameters, buffers and optimizer state by name, so
// the next optimizer step is the same as on the old cut.
#include "worker/reshard.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "services/spec/job_spec.h"
#include "services/training/optimizer.h"

namespace stagewise::worker {
namespace {

constexpr uint64_t kSeed = 7;

ModelSpec RevNet() {
  ModelSpec s;
  s.name = ModelKind::kRevNet;
  s.depth = 18;
  s.width = 8;
  s.input_shape = {3, 16, 16};
  s.num_classes = 4;
  return s;  // 10 blocks
}

OptimizerSpec Adam() {
  OptimizerSpec o;
  o.name = OptimizerKind::kAdam;
  o.lr = 0.01;
  o.weight_decay = 1e-4;
  return o;
}

std::shared_ptr<models::Model> Build(int begin, int end) {
  auto m = models::BuildModel(RevNet(), kSeed, begin, end);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

// The same pseudo-random gradient for a tensor of a given name, whatever stage holds it.
torch::Tensor GradFor(const std::string& name, const torch::Tensor& like, int round) {
  const uint64_t h = std::hash<std::string>()(name) + 1000003ULL * static_cast<uint64_t>(round);
  torch::Generator gen = at::detail::createCPUGenerator(h);
  return torch::randn(like.sizes(), gen, like.options());
}

// Gives every parameter a gradient (by name) and steps.
void Step(models::Model& model, torch::optim::Optimizer& optimizer, int round) {
  for (auto& p : model.named_parameters())
    p.value().mutable_grad() = GradFor(p.key(), p.value(), round);
  optimizer.step();
}

struct Stage {
  std::shared_ptr<models::Model> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<checkpoint::ShardReader> shard;  // its shard
  int begin = 0, end = 0;
};

// A stage of the old cut after two steps, its running statistics moved, saved.
Stage Trained(int begin, int end) {
  Stage s;
  s.begin = begin;
  s.end = end;
  s.model = Build(begin, end);
  s.optimizer = training::MakeOptimizer(Adam(), *s.model);
  for (int round = 0; round < 2; ++round) Step(*s.model, *s.optimizer, round);
  torch::NoGradGuard no_grad;
  for (auto& b : s.model->named_buffers()) {
    if (b.value().is_floating_point()) b.value().add_(GradFor(b.key(), b.value(), 9).abs());
  }
  checkpoint::ShardPosition at;
  at.block_begin = begin;
  at.block_end = end;
  auto data = checkpoint::SerializeShard(at, *s.model, *s.optimizer);
  EXPECT_TRUE(data.ok()) << data.status();
  auto shard = checkpoint::ShardReader::Parse(*data, torch::kCPU, "stage shard");
  EXPECT_TRUE(shard.ok()) << shard.status();
  s.shard = std::move(*shard);
  return s;
}

std::map<std::string, torch::Tensor> Tensors(models::Model& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

absl::Status Regroup(const std::vector<const Stage*>& from, models::Model& model,
                     torch::optim::Optimizer& optimizer) {
  std::vector<ReshardSource> sources;
  for (const Stage* s : from) {
    sources.push_back(
        {"stage-" + std::to_string(s->begin) + ".pt", s->begin, s->end, s->shard.get()});
  }
  return RegroupShards(
      sources, model, optimizer,
      [](int b, int e) -> absl::StatusOr<std::shared_ptr<models::Model>> {
        return models::BuildModel(RevNet(), kSeed, b, e);
      },
      [](models::Model& m) { return training::MakeOptimizer(Adam(), m); });
}

TEST(Reshard, FourStagesOntoOneHoldTheSameTensorsAndTakeTheSameNextStep) {
  // Old cut: 4 stages; new stage: blocks [1, 8), parts of three of them.
  std::vector<Stage> old;
  for (const auto& [b, e] : std::vector<std::pair<int, int>>{{0, 1}, {1, 4}, {4, 7}, {7, 10}}) {
    old.push_back(Trained(b, e));
  }
  auto model = Build(1, 8);
  auto optimizer = training::MakeOptimizer(Adam(), *model);
  ASSERT_TRUE(Regroup({&old[1], &old[2], &old[3]}, *model, *optimizer).ok());

  std::map<std::string, torch::Tensor> want;
  for (Stage& s : old) {
    for (auto& [name, t] : Tensors(*s.model)) want[name] = t;
  }
  const std::map<std::string, torch::Tensor> got = Tensors(*model);
  ASSERT_FALSE(got.empty());
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, want.at(name))) << name;
  }
  // The optimizer state came along: one more step with the same gradients
  // moves every parameter as the old stages' steps do (Adam's moments and
  // step count; a fresh Adam would take a step of another size).
  Step(*model, *optimizer, 2);
  for (Stage& s : old) Step(*s.model, *s.optimizer, 2);
  for (Stage& s : old) {
    for (auto& [name, t] : Tensors(*s.model)) want[name] = t;
  }
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), want.at(p.key()), 0, 0)) << p.key();
  }
}

TEST(Reshard, AMissingShardIsDataLossNamingATensor) {
  Stage a = Trained(0, 3), c = Trained(5, 10);
  auto model = Build(0, 10);
  auto optimizer = training::MakeOptimizer(Adam(), *model);
  const absl::Status s = Regroup({&a, &c}, *model, *optimizer);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("in none of the shards: 3."), std::string::npos) << s;
}

TEST(Reshard, AShardOfOtherBlocksThanItsRangeIsDataLoss) {
  Stage a = Trained(0, 3);
  a.end = 4;  // says it holds [0, 4)
  auto model = Build(0, 4);
  auto optimizer = training::MakeOptimizer(Adam(), *model);
  const absl::Status s = Regroup({&a}, *model, *optimizer);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("does not hold blocks [0, 4)"), std::string::npos) << s;
}

}  // namespace
}  // namespace stagewise::worker
