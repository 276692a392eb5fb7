// Oracle: composing the separately built stages of any partition gives the
// outputs and gradients of the whole model (docs/models.md: every stage builds
// its blocks from (job seed, global block index)).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "services/models/model.h"

namespace stagewise::models {
namespace {

struct Case {
  std::string name;
  int depth;
  std::vector<int> blocks;
  std::vector<std::pair<int, int>> partition;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << c.depth; }

class PartitionComposition : public ::testing::TestWithParam<Case> {};

TEST_P(PartitionComposition, StagesComposeToTheWholeModel) {
  const Case& c = GetParam();
  ModelSpec spec;
  spec.name = *EnumFromName<ModelKind>(c.name);
  spec.depth = c.depth;
  spec.width = 4;
  spec.blocks = c.blocks;
  spec.hidden = {32, 32, 16};
  spec.input_shape = {3, 16, 16};
  spec.num_classes = 10;
  const uint64_t seed = 11;

  auto whole = BuildModel(spec, seed);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<std::shared_ptr<Model>> stages;
  for (const auto& [b, e] : c.partition) {
    auto stage = BuildModel(spec, seed, b, e);
    ASSERT_TRUE(stage.ok()) << stage.status();
    stages.push_back(*stage);
  }
  ASSERT_EQ(stages.back()->end(), whole.value()->end());

  torch::manual_seed(1);
  torch::Tensor x = torch::randn({6, 3, 16, 16});
  torch::Tensor y = torch::randint(0, 10, {6});

  torch::Tensor whole_out = (*whole)->forward(x);
  torch::cross_entropy_loss(whole_out, y).backward();

  // Stage by stage, as a pipeline would: each stage's input is a detached
  // leaf, and the gradient w.r.t. it is handed to the previous stage.
  std::vector<torch::Tensor> inputs, outputs;
  torch::Tensor h = x;
  for (auto& stage : stages) {
    torch::Tensor in = h.detach().requires_grad_(true);
    inputs.push_back(in);
    h = stage->forward(in);
    outputs.push_back(h);
  }
  EXPECT_TRUE(torch::allclose(h, whole_out, 1e-5, 1e-6));
  torch::cross_entropy_loss(h, y).backward();
  for (int j = static_cast<int>(stages.size()) - 2; j >= 0; --j) {
    outputs[j].backward(inputs[j + 1].grad());
  }

  auto reference = (*whole)->named_parameters();
  size_t compared = 0;
  for (auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      const torch::Tensor& want = reference[item.key()].grad();
      const torch::Tensor& got = item.value().grad();
      ASSERT_TRUE(got.defined()) << item.key();
      const double err = ((got - want).norm() / want.norm().clamp_min(1e-12)).item<double>();
      EXPECT_LE(err, 1e-5) << item.key();
      ++compared;
    }
  }
  EXPECT_EQ(compared, reference.size());
}

INSTANTIATE_TEST_SUITE_P(Zoo, PartitionComposition,
                         ::testing::Values(Case{"revnet", 18, {}, {{0, 3}, {3, 7}, {7, 10}}},
                                           Case{
                                               "revnet", 18, {}, {{0, 1}, {1, 2}, {2, 9}, {9, 10}}},
                                           Case{"revnet", 50, {1, 1, 1, 1}, {{0, 2}, {2, 6}}},
                                           Case{"resnet", 20, {}, {{0, 5}, {5, 11}}},
                                           Case{"mlp", 0, {}, {{0, 1}, {1, 2}, {2, 4}}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name + std::to_string(info.param.depth) + "_" +
                                  std::to_string(info.param.partition.size()) + "stages";
                         });

}  // namespace
}  // namespace stagewise::models
