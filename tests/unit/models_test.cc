// Model zoo: shapes, parameter counts, determinism, reversible inverses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "services/models/batch_norm.h"
#include "services/models/blocks.h"
#include "services/models/model.h"

namespace stagewise::models {
namespace {

ModelSpec Spec(const std::string& name, int depth, int width, std::vector<int64_t> input,
               int classes) {
  ModelSpec s;
  s.name = *EnumFromName<ModelKind>(name);
  s.depth = depth;
  s.width = width;
  s.input_shape = std::move(input);
  s.num_classes = classes;
  return s;
}

double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-12)).item<double>();
}

TEST(PlanModel, RevNet18HasPetraLayout) {
  auto plan = PlanModel(Spec("revnet", 18, 8, {3, 32, 32}, 10));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // stem, R, R, D, R, D, R, D, R, head: 10 stages as in PETRA Sec. 4.1.
  std::vector<std::string> kinds;
  for (const auto& b : *plan) kinds.push_back(b.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"stem", "reversible", "reversible", "downsample",
                                             "reversible", "downsample", "reversible", "downsample",
                                             "reversible", "head"}));
  EXPECT_EQ((*plan)[0].out_shape, (std::vector<int64_t>{16, 32, 32}));  // 2 streams of 8
  EXPECT_EQ((*plan)[8].out_shape, (std::vector<int64_t>{128, 4, 4}));
  EXPECT_EQ(plan->back().out_shape, (std::vector<int64_t>{10}));
  for (size_t i = 1; i < plan->size(); ++i) {
    EXPECT_EQ((*plan)[i].in_shape, (*plan)[i - 1].out_shape) << "block " << i;
    EXPECT_EQ((*plan)[i].index, static_cast<int>(i));
  }
}

TEST(PlanModel, BlockCounts) {
  struct Case {
    std::string name;
    int depth;
    std::string style;
    size_t blocks;
  };
  for (const Case& c : std::vector<Case>{{"resnet", 20, "cifar", 11},
                                         {"resnet", 56, "cifar", 29},
                                         {"resnet", 110, "cifar", 56},
                                         {"resnet", 18, "imagenet", 10},
                                         {"resnet", 34, "imagenet", 18},
                                         {"resnet", 50, "imagenet", 18},
                                         {"revnet", 34, "cifar", 18},
                                         {"revnet", 50, "cifar", 18}}) {
    ModelSpec s = Spec(c.name, c.depth, 8, {3, 32, 32}, 10);
    s.style = *EnumFromName<ResNetStyle>(c.style);
    auto plan = PlanModel(s);
    ASSERT_TRUE(plan.ok()) << c.name << c.depth << ": " << plan.status();
    EXPECT_EQ(plan->size(), c.blocks) << c.name << c.depth;
  }
}

TEST(PlanModel, RejectsBadSpecsNamingTheKey) {
  ModelSpec bad_depth = Spec("resnet", 21, 8, {3, 32, 32}, 10);
  EXPECT_NE(PlanModel(bad_depth).status().message().find("model.depth"), std::string::npos);
  ModelSpec bad_blocks = Spec("revnet", 18, 8, {3, 32, 32}, 10);
  bad_blocks.blocks = {1, 1};
  EXPECT_NE(PlanModel(bad_blocks).status().message().find("model.blocks"), std::string::npos);
  ModelSpec flat = Spec("revnet", 18, 8, {784}, 10);
  EXPECT_FALSE(PlanModel(flat).ok());
}

// Published parameter counts: torchvision's ResNet-18/50 and He et al.'s ResNet-20.
TEST(BuildModel, ParameterCountsMatchThePapers) {
  ModelSpec r18 = Spec("resnet", 18, 0, {3, 224, 224}, 1000);
  r18.style = ResNetStyle::kImageNet;
  r18.small_input = false;
  auto m18 = BuildModel(r18, 0);
  ASSERT_TRUE(m18.ok()) << m18.status();
  EXPECT_EQ((*m18)->num_parameters(), 11689512);

  ModelSpec r50 = r18;
  r50.depth = 50;
  auto m50 = BuildModel(r50, 0);
  ASSERT_TRUE(m50.ok());
  EXPECT_EQ((*m50)->num_parameters(), 25557032);

  auto m20 = BuildModel(Spec("resnet", 20, 0, {3, 32, 32}, 10), 0);
  ASSERT_TRUE(m20.ok());
  // 0.27M in He et al. Tab. 6 (option A shortcuts; ours are 1x1 projections).
  EXPECT_GT((*m20)->num_parameters(), 265000);
  EXPECT_LT((*m20)->num_parameters(), 280000);

  // RevNet-18 keeps ResNet-18's count up to the wider head and the pair
  // projections (PETRA Tab. 2: 12.2M vs 11.7M).
  ModelSpec rev18 = r18;
  rev18.name = ModelKind::kRevNet;
  rev18.depth = 18;
  auto mrev = BuildModel(rev18, 0);
  ASSERT_TRUE(mrev.ok());
  EXPECT_GT((*mrev)->num_parameters(), 11689512);
  EXPECT_LT((*mrev)->num_parameters(), 12700000);
}

TEST(BuildModel, EveryBlockProducesItsPlannedShape) {
  std::vector<ModelSpec> specs = {
      Spec("mlp", 0, 0, {1, 28, 28}, 10), Spec("resnet", 20, 4, {3, 32, 32}, 10),
      Spec("revnet", 18, 4, {1, 28, 28}, 10), Spec("revnet", 50, 2, {3, 32, 32}, 100)};
  ModelSpec imagenet = Spec("resnet", 50, 4, {3, 64, 64}, 10);
  imagenet.style = ResNetStyle::kImageNet;
  imagenet.small_input = false;
  specs.push_back(imagenet);
  specs[0].hidden = {32, 16};
  for (const auto& spec : specs) {
    auto model = BuildModel(spec, 1);
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<int64_t> in = {3};
    in.insert(in.end(), spec.input_shape.begin(), spec.input_shape.end());
    torch::Tensor h = torch::randn(in);
    for (const auto& block : (*model)->blocks()) {
      h = block->forward(h);
      std::vector<int64_t> want = {3};
      want.insert(want.end(), block->info().out_shape.begin(), block->info().out_shape.end());
      EXPECT_EQ(h.sizes().vec(), want) << NameOf(spec.name) << " block " << block->info().index;
    }
  }
}

TEST(BuildModel, SameSeedSameWeightsOtherSeedOtherWeights) {
  ModelSpec s = Spec("revnet", 18, 4, {1, 28, 28}, 10);
  auto a = BuildModel(s, 7), b = BuildModel(s, 7), c = BuildModel(s, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto pa = (*a)->named_parameters(), pb = (*b)->named_parameters(), pc = (*c)->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool any_different = false;
  for (const auto& item : pa) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
    if (item.value().numel() > 1 && !torch::equal(item.value(), pc[item.key()])) {
      any_different = true;
    }
  }
  EXPECT_TRUE(any_different);
}

TEST(BuildModel, StagesHoldTheWholeModelsWeights) {
  ModelSpec s = Spec("revnet", 18, 4, {1, 28, 28}, 10);
  auto whole = BuildModel(s, 3);
  auto stage = BuildModel(s, 3, 4, 7);
  ASSERT_TRUE(whole.ok() && stage.ok());
  EXPECT_EQ((*stage)->begin(), 4);
  EXPECT_EQ((*stage)->end(), 7);
  auto all = (*whole)->named_parameters();
  auto part = (*stage)->named_parameters();
  ASSERT_GT(part.size(), 0u);
  for (const auto& item : part) {
    ASSERT_TRUE(all.contains(item.key())) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), all[item.key()])) << item.key();
  }
  EXPECT_FALSE(BuildModel(s, 3, 7, 4).ok());
  EXPECT_FALSE(BuildModel(s, 3, 0, 11).ok());
}

class ReversibleInverse : public ::testing::TestWithParam<bool> {};

// Inverse rebuilds the input to <= 1e-5 relative, with batch statistics in
// training mode and running statistics in eval mode.
TEST_P(ReversibleInverse, RebuildsTheInput) {
  const bool bottleneck = GetParam();
  torch::manual_seed(0);
  BlockInfo info;
  info.kind = "reversible";
  info.reversible = true;
  info.in_channels = 32;
  info.out_channels = 16;
  info.mid_channels = 8;
  info.bottleneck = bottleneck;
  auto block = std::dynamic_pointer_cast<ReversibleBlock>(MakeBlock(info));
  ASSERT_TRUE(block);
  ASSERT_TRUE(block->reversible());
  torch::Tensor x = torch::randn({8, 32, 6, 6});
  block->train();
  for (int i = 0; i < 3; ++i) block->forward(torch::randn({8, 32, 6, 6}) * 2 + 1);
  {
    torch::NoGradGuard g;
    torch::Tensor y = block->forward(x);
    EXPECT_GT(RelativeError(y, x), 1e-2);  // the block does something
    EXPECT_LE(RelativeError(block->inverse(y), x), 1e-5);
  }
  block->eval();
  {
    torch::NoGradGuard g;
    torch::Tensor y = block->forward(x);
    EXPECT_LE(RelativeError(block->inverse(y), x), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(BasicAndBottleneck, ReversibleInverse, ::testing::Bool());

TEST(ReversibleInverse, WholeRevNetStackInvertsBlockByBlock) {
  ModelSpec s = Spec("revnet", 18, 4, {3, 16, 16}, 10);
  s.blocks = {3, 2, 1, 1};
  auto model = BuildModel(s, 5);
  ASSERT_TRUE(model.ok());
  torch::NoGradGuard g;
  torch::Tensor h = torch::randn({4, 3, 16, 16});
  int checked = 0;
  for (const auto& b : (*model)->blocks()) {
    torch::Tensor out = b->forward(h);
    if (b->reversible()) {
      EXPECT_LE(RelativeError(b->inverse(out), h), 1e-5) << "block " << b->info().index;
      ++checked;
    } else {
      EXPECT_THROW(b->inverse(out), c10::Error);
    }
    h = out;
  }
  EXPECT_EQ(checked, 4);
}

TEST(BatchNorm, FrozenRunningStatsStayPutButBatchStatsAreUsed) {
  BatchNorm bn(4);
  bn->train();
  torch::Tensor x = torch::randn({16, 4, 3, 3}) * 3 + 2;
  torch::Tensor mean_before = bn->running_mean.clone();
  torch::Tensor y_frozen;
  {
    FreezeRunningStats freeze;
    EXPECT_TRUE(FreezeRunningStats::active());
    y_frozen = bn->forward(x);
  }
  EXPECT_FALSE(FreezeRunningStats::active());
  EXPECT_TRUE(torch::equal(bn->running_mean, mean_before));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 0);
  torch::Tensor y = bn->forward(x);
  EXPECT_TRUE(torch::allclose(y, y_frozen, 1e-6, 1e-6));
  EXPECT_FALSE(torch::equal(bn->running_mean, mean_before));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
  // Batch statistics: output has ~zero mean per channel.
  EXPECT_LT(y.mean({0, 2, 3}).abs().max().item<double>(), 1e-5);
}

TEST(ResolvePartition, EvenAndExplicit) {
  const std::vector<BlockInfo> ten(10), twelve(12);
  StagesSpec even;
  even.partition = Partition::kEven;
  even.count = 3;
  auto r = ResolvePartition(even, ten);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::pair<int, int>>{{0, 4}, {4, 7}, {7, 10}}));
  even.count = 11;
  EXPECT_NE(ResolvePartition(even, ten).status().message().find("stages.count"), std::string::npos);

  StagesSpec expl;
  expl.partition = Partition::kExplicit;
  expl.ranges = {{0, 2}, {2, 10}};
  expl.count = 2;
  ASSERT_TRUE(ResolvePartition(expl, ten).ok());
  EXPECT_NE(ResolvePartition(expl, twelve).status().message().find("stages.partition"),
            std::string::npos);
  expl.ranges = {{0, 2}, {3, 10}};
  EXPECT_FALSE(ResolvePartition(expl, ten).ok());
}

// The quickstart RevNet: its early blocks work on 28x28 maps and cost more
// than the later ones, so the even split overloads stage 0 (about 60% of a
// profiled step on one CPU thread) and the balanced one cuts a block earlier,
// where the profiled planner cuts too (docs/planner.md).
TEST(ResolvePartition, BalancedIsTheDefaultAndEvensOutTheEstimatedWork) {
  ModelSpec model;
  model.name = ModelKind::kRevNet;
  model.depth = 18;
  model.width = 16;
  model.small_input = true;
  model.input_shape = {1, 28, 28};
  model.num_classes = 10;
  auto blocks = PlanModel(model);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  ASSERT_EQ(blocks->size(), 10u);
  EXPECT_GT(EstimateBlockWork((*blocks)[1]), EstimateBlockWork((*blocks)[6]));
  EXPECT_GT(EstimateBlockWork((*blocks)[6]),
            10 * EstimateBlockWork((*blocks)[9]));  // 28.5 vs 1.1 ms

  StagesSpec stages;
  EXPECT_EQ(stages.partition, Partition::kBalanced);
  stages.count = 2;
  auto balanced = ResolvePartition(stages, *blocks);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  EXPECT_EQ(*balanced, (std::vector<std::pair<int, int>>{{0, 4}, {4, 10}}));
  stages.partition = Partition::kEven;
  auto even = ResolvePartition(stages, *blocks);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(*even, (std::vector<std::pair<int, int>>{{0, 5}, {5, 10}}));

  // The balanced bottleneck is never worse than the even one, for any J.
  auto bottleneck = [&](const std::vector<std::pair<int, int>>& ranges) {
    double worst = 0;
    for (const auto& [b, e] : ranges) {
      double sum = 0;
      for (int i = b; i < e; ++i) sum += EstimateBlockWork((*blocks)[i]);
      worst = std::max(worst, sum);
    }
    return worst;
  };
  for (int j = 1; j <= 10; ++j) {
    stages.count = j;
    stages.partition = Partition::kBalanced;
    auto b = ResolvePartition(stages, *blocks);
    stages.partition = Partition::kEven;
    auto e = ResolvePartition(stages, *blocks);
    ASSERT_TRUE(b.ok() && e.ok()) << j;
    ASSERT_EQ(b->size(), static_cast<size_t>(j));
    EXPECT_LE(bottleneck(*b), bottleneck(*e) * (1 + 1e-12)) << j;
  }
}

// Emulated blocks are charged by their configured times: heavier blocks get
// stages of their own.
TEST(ResolvePartition, BalancedFollowsEmulatedTimes) {
  std::vector<BlockInfo> blocks(6);
  for (int i = 0; i < 6; ++i) {
    blocks[i].index = i;
    blocks[i].kind = "emulated";
    blocks[i].in_shape = blocks[i].out_shape = {4};
    blocks[i].forward_seconds_per_sample = i < 2 ? 4e-3 : 1e-3;
    blocks[i].backward_seconds_per_sample = 2 * blocks[i].forward_seconds_per_sample;
  }
  StagesSpec stages;
  stages.count = 3;
  auto r = ResolvePartition(stages, blocks);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 6}}));
}

}  // namespace
}  // namespace stagewise::models
