// stages.bottleneck (docs/models.md, "Bottlenecks at the cuts"): the
// projections sit at the cuts of the job's partition, carry the planned
// shapes, start as a projection, and move no cut when the stage count is the
// job's; the spec refuses what cannot hold them, naming the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/models/model.h"
#include "services/models/plan.h"
#include "services/spec/job_spec.h"

namespace stagewise::models {
namespace {

using ::testing::HasSubstr;
using Ranges = std::vector<std::pair<int, int>>;

std::string Job(const std::string& model, const std::string& stages, const std::string& data) {
  return absl::StrCat("name: b\nseed: 3\nmodel: ", model, "\ndata: ", data, "\nstages: ", stages,
                      "\nbatch_size: 8\nsteps: 2\n");
}
const char kImages[] = "{dataset: synthetic, shape: [1, 16, 16], classes: 4}";
const char kText[] = "{dataset: fortunes, sequence_length: 12}";

JobSpec Parse(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

// Explicit ranges name the model without the projections; each cut gets a
// down- then an up-projection and the job's stage count cuts between them.
TEST(Bottleneck, ProjectionsSitAtTheCutsOfTheJobsPartition) {
  const JobSpec plain = Parse(Job("{name: revnet, depth: 18, width: 4}", "3", kImages));
  auto base = PlanModel(plain.model);
  ASSERT_TRUE(base.ok()) << base.status();
  const int n = static_cast<int>(base->size());
  const JobSpec spec = Parse(Job(
      "{name: revnet, depth: 18, width: 4}",
      absl::StrCat("{partition: [[0, 2], [2, 5], [5, ", n, "]], bottleneck: {rank: 3}}"), kImages));
  auto blocks = PlanModel(spec.model);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  ASSERT_EQ(static_cast<int>(blocks->size()), n + 4);
  const std::vector<int> down_at = {2, 7}, up_at = {3, 8};
  for (int k = 0; k < 2; ++k) {
    const BlockInfo& down = (*blocks)[down_at[k]];
    const BlockInfo& up = (*blocks)[up_at[k]];
    EXPECT_EQ(down.kind, "bottleneck_down");
    EXPECT_EQ(up.kind, "bottleneck_up");
    EXPECT_EQ(down.in_shape, (*blocks)[down_at[k] - 1].out_shape);
    EXPECT_EQ(down.out_shape[0], 3);  // [C, H, W]: 3 channels cross
    EXPECT_EQ(up.in_shape, down.out_shape);
    EXPECT_EQ(up.out_shape, down.in_shape);
    EXPECT_EQ((*blocks)[up_at[k] + 1].in_shape, up.out_shape);
  }
  for (size_t i = 0; i < blocks->size(); ++i) EXPECT_EQ((*blocks)[i].index, static_cast<int>(i));
  auto ranges = ResolvePartition(spec.stages, *blocks);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  EXPECT_EQ(*ranges, (Ranges{{0, 3}, {3, 8}, {8, n + 4}}));
  // Balanced and even cut the model without projections; the projections follow.
  for (const char* partition : {"balanced", "even"}) {
    const JobSpec other = Parse(Job(
        "{name: revnet, depth: 18, width: 4}",
        absl::StrCat("{count: 2, partition: ", partition, ", bottleneck: {rank: 2}}"), kImages));
    StagesSpec base_stages = other.stages;
    base_stages.bottleneck.rank = 0;
    auto base_ranges = ResolvePartition(base_stages, *base);
    auto with = PlanModel(other.model);
    ASSERT_TRUE(base_ranges.ok() && with.ok());
    auto cut = ResolvePartition(other.stages, *with);
    ASSERT_TRUE(cut.ok()) << cut.status();
    EXPECT_EQ(*cut,
              (Ranges{{0, (*base_ranges)[0].second + 1}, {(*base_ranges)[0].second + 1, n + 2}}))
        << partition;
  }
  // Another stage count (recovery onto fewer stages) cuts the whole model afresh.
  StagesSpec two;
  two.count = 2;
  two.partition = Partition::kEven;
  auto fewer = ResolvePartition(two, *blocks);
  ASSERT_TRUE(fewer.ok()) << fewer.status();
  EXPECT_EQ(fewer->size(), 2u);
  EXPECT_EQ(fewer->back().second, n + 4);
}

// Every block yields its planned shape (images: 1x1 convolutions; text:
// linear maps of [T, width]); the down- and up-projection start as a
// projection (applying them twice is applying them once); a stage holds the
// whole model's weights, and the reference builds the same ones.
TEST(Bottleneck, BuildsThePlannedShapesAndStartsAsAProjection) {
  const std::vector<std::pair<JobSpec, std::vector<int64_t>>> cases = {
      {Parse(Job("{name: revnet, depth: 18, width: 4}", "{count: 3, bottleneck: {rank: 3}}",
                 kImages)),
       {1, 16, 16}},
      {Parse(Job("{name: gpt, depth: 2, width: 16, heads: 2}", "{count: 2, bottleneck: {rank: 4}}",
                 kText)),
       {12}},
      {Parse(Job("{name: mlp, hidden: [32, 16]}", "{count: 2, bottleneck: {rank: 5}}", kImages)),
       {1, 16, 16}},
  };
  for (const auto& [spec, input] : cases) {
    const std::string name(NameOf(spec.model.name));
    auto model = BuildModel(spec.model, 3);
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
    std::vector<int64_t> in = {2};
    in.insert(in.end(), input.begin(), input.end());
    torch::Tensor h =
        spec.model.name == ModelKind::kGpt ? torch::randint(0, 256, in) : torch::randn(in);
    int projections = 0;
    for (size_t i = 0; i < (*model)->blocks().size(); ++i) {
      const auto& block = (*model)->blocks()[i];
      h = block->forward(h);
      std::vector<int64_t> want = {2};
      want.insert(want.end(), block->info().out_shape.begin(), block->info().out_shape.end());
      ASSERT_EQ(h.sizes().vec(), want) << name << " block " << i;
      if (block->info().kind != "bottleneck_up") continue;
      ++projections;
      const auto& down = (*model)->blocks()[i - 1];
      torch::NoGradGuard no_grad;
      const torch::Tensor again = block->forward(down->forward(h));
      EXPECT_TRUE(torch::allclose(again, h, 1e-4, 1e-5)) << name << " cut before block " << i;
      EXPECT_GT(h.abs().max().item<double>(), 0) << name;
    }
    EXPECT_EQ(projections, spec.stages.count - 1) << name;
    auto stage = BuildModel(spec.model, 3, 1, static_cast<int>((*model)->blocks().size()));
    ASSERT_TRUE(stage.ok()) << stage.status();
    auto all = (*model)->named_parameters();
    for (const auto& item : (*stage)->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), all[item.key()])) << name << " " << item.key();
    }
  }
}

TEST(Bottleneck, RefusesWhatCannotHoldItNamingTheKey) {
  auto error = [](const std::string& yaml) {
    auto spec = ParseJobSpec(yaml);
    if (!spec.ok()) return std::string(spec.status().message());
    auto blocks = PlanModel(spec->model);
    return blocks.ok() ? std::string("planned") : std::string(blocks.status().message());
  };
  const std::string revnet = "{name: revnet, depth: 18, width: 4}";
  EXPECT_THAT(error(Job(revnet, "{count: 1, bottleneck: {rank: 2}}", kImages)),
              HasSubstr("stages.bottleneck: sits at the cuts between stages"));
  EXPECT_THAT(error(Job(revnet, "{count: 2, partition: auto, bottleneck: {rank: 2}}", kImages)),
              HasSubstr("stages.bottleneck: is part of the model"));
  EXPECT_THAT(error(Job(revnet, "{count: 2, bottleneck: {rank: -1}}", kImages)),
              HasSubstr("stages.bottleneck.rank: must be in [1, 65536], got -1"));
  EXPECT_THAT(error(Job(revnet, "{count: 2, bottleneck: {rank: 64}}", kImages)),
              HasSubstr("stages.bottleneck.rank: 64 is not below the"));
  EXPECT_THAT(error(Job(revnet, "{count: 2, bottleneck: {size: 2}}", kImages)),
              HasSubstr("stages.bottleneck.size"));
  EXPECT_THAT(error(Job(revnet, "{count: 2, bottleneck: 2}", kImages)),
              HasSubstr("stages.bottleneck"));
  EXPECT_EQ(error(Job(revnet, "{count: 2, bottleneck: {rank: 2}}", kImages)), "planned");
}

}  // namespace
}  // namespace stagewise::models
