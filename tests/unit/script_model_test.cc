// TorchScript models (docs/torchscript.md): the dry run, the errors that name
// the file and the block, and ScriptBlock's rebuild and frozen statistics.
// The fixtures come from tests/fixtures/torchscript/make_models.py.
#include "services/models/script_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/models/model.h"
#include "services/models/plan.h"
#include "services/spec/job_spec.h"

namespace stagewise::models {
namespace {

std::string Fixture(const std::string& name) {
  return absl::StrCat(STAGEWISE_SOURCE_DIR, "/tests/fixtures/torchscript/", name);
}

JobSpec Spec(const std::string& file, const std::string& extra = "") {
  auto spec = ParseJobSpec(absl::StrCat(R"(name: ts
model: {name: torchscript, path: ")",
                                        file, "\"", extra, R"(}
data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [1, 28, 28], classes: 10}
batch_size: 8
steps: 1
)"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// The spec as the CLI hands it on: with the dry run's findings.
JobSpec Inspected(const std::string& name) {
  JobSpec spec = Spec(Fixture(name));
  auto blocks = InspectScriptModel(spec.model);
  EXPECT_TRUE(blocks.ok()) << blocks.status();
  if (blocks.ok()) spec.model.script_blocks = *blocks;
  spec.model.script_file = spec.model.path;
  spec.model.script_bytes = static_cast<int64_t>(std::filesystem::file_size(spec.model.path));
  return spec;
}

TEST(ScriptModel, DryRunFindsShapesParametersAndReversibleBlocks) {
  JobSpec spec = Inspected("revnet_twin.pt");
  const auto& b = spec.model.script_blocks;
  ASSERT_EQ(b.size(), 7u);
  EXPECT_EQ(b[0].in_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(b[0].out_shape, (std::vector<int64_t>{8, 28, 28}));
  EXPECT_EQ(b[3].out_shape, (std::vector<int64_t>{16, 14, 14}));
  EXPECT_EQ(b[6].out_shape, (std::vector<int64_t>{10}));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i].reversible, i == 1 || i == 2) << i;
  // The stem: a 3x3 convolution 1 -> 8 without bias, BatchNorm weight and bias.
  EXPECT_EQ(b[0].parameters, 9 * 8 + 2 * 8);
  // The plan the coordinator makes from it (no LibTorch there).
  auto plan = PlanModel(spec.model);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 7u);
  EXPECT_EQ((*plan)[1].kind, "script");
  EXPECT_TRUE((*plan)[1].reversible);
  EXPECT_EQ((*plan)[4].in_shape, (std::vector<int64_t>{16, 14, 14}));
  EXPECT_GT(EstimateBlockWork((*plan)[1]), EstimateBlockWork((*plan)[6]));
}

TEST(ScriptModel, BadFilesAreRefusedNamingTheFileAndTheBlock) {
  struct Case {
    std::string file, want;
  };
  const std::vector<Case> cases = {
      {"missing.pt", "TorchScript file not found"},
      {"not_torchscript.pt", "is not a TorchScript file"},
      {"no_blocks.pt", "has no `blocks`"},
      {"empty_blocks.pt", "`blocks` is empty"},
      {"shape_mismatch.pt", "block 1 fails on input of shape [4] (per sample): RuntimeError"},
      {"bad_inverse.pt", "block 1 exports `inverse`, but it does not invert its forward"},
  };
  for (const Case& c : cases) {
    JobSpec spec = Spec(Fixture(c.file));
    auto blocks = InspectScriptModel(spec.model);
    ASSERT_FALSE(blocks.ok()) << c.file;
    EXPECT_NE(blocks.status().message().find(c.want), std::string::npos)
        << c.file << ": " << blocks.status();
    EXPECT_NE(blocks.status().message().find("model.path: "), std::string::npos) << c.file;
  }
  // The tolerance is the job's (the bad inverse returns 4x for x, off by
  // about 2.5 on this batch).
  JobSpec loose = Spec(Fixture("bad_inverse.pt"), ", inverse_tolerance: 0.5");
  auto refused = InspectScriptModel(loose.model);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(
      refused.status().message().find("on a random batch, above model.inverse_tolerance = 0.5"),
      std::string::npos)
      << refused.status();
  JobSpec lenient = Spec(Fixture("bad_inverse.pt"), ", inverse_tolerance: 1");
  EXPECT_FALSE(InspectScriptModel(lenient.model).ok()) << "2.5 is still above 1";
}

TEST(ScriptModel, TheSpecNeedsAPathAndTheCoordinatorNeedsTheDryRun) {
  auto no_path = ParseJobSpec(R"(name: ts
model: {name: torchscript}
data: {dataset: synthetic, shape: [1, 28, 28], classes: 10}
batch_size: 8
steps: 1
)");
  ASSERT_FALSE(no_path.ok());
  EXPECT_NE(no_path.status().message().find("model.path: required"), std::string::npos)
      << no_path.status();
  auto path_on_zoo = ParseJobSpec(R"(name: ts
model: {name: mlp, path: x.pt}
data: {dataset: synthetic, shape: [1, 28, 28], classes: 10}
batch_size: 8
steps: 1
)");
  ASSERT_FALSE(path_on_zoo.ok());
  EXPECT_NE(path_on_zoo.status().message().find("model.path: only for model.name torchscript"),
            std::string::npos);
  // Without the script_model section, the coordinator cannot plan.
  auto plan = PlanModel(Spec(Fixture("mlp_twin.pt")).model);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("stagewise CLI"), std::string::npos);
  // The section round-trips through the job's text.
  JobSpec inspected = Inspected("mlp_twin.pt");
  const std::string yaml = absl::StrCat(R"(name: ts
model: {name: torchscript, path: ")",
                                        Fixture("mlp_twin.pt"), R"("}
data: {dataset: synthetic, shape: [1, 28, 28], classes: 10}
batch_size: 8
steps: 1
)",
                                        ScriptModelSection(inspected.model));
  auto parsed = ParseJobSpec(yaml);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << yaml;
  ASSERT_EQ(parsed->model.script_blocks.size(), 3u);
  EXPECT_EQ(parsed->model.script_blocks[1].out_shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(parsed->model.script_bytes, inspected.model.script_bytes);
  EXPECT_EQ(parsed->model.script_file, inspected.model.script_file);
  // Blocks that do not chain, or a last block without one logit per class.
  JobSpec broken = inspected;
  broken.model.script_blocks[1].in_shape = {17};
  plan = PlanModel(broken.model);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("script_model.blocks[1].in: block 1 takes [17] but "
                                         "block 0 outputs [32]"),
            std::string::npos)
      << plan.status();
  broken = inspected;
  broken.model.num_classes = 4;
  plan = PlanModel(broken.model);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("one logit per class, [4]"), std::string::npos)
      << plan.status();
}

TEST(ScriptModel, WorkersRefuseAFileThatIsNotTheOneInspected) {
  JobSpec spec = Inspected("mlp_twin.pt");
  spec.model.script_bytes += 1;
  auto blocks = LoadScriptBlocks(spec.model, 0, -1);
  ASSERT_FALSE(blocks.ok());
  EXPECT_NE(blocks.status().message().find("every worker must load the same file"),
            std::string::npos)
      << blocks.status();
  spec = Inspected("mlp_twin.pt");
  spec.model.script_blocks.pop_back();
  blocks = LoadScriptBlocks(spec.model, 0, -1);
  ASSERT_FALSE(blocks.ok());
  EXPECT_NE(blocks.status().message().find("has 3 blocks here but 2"), std::string::npos)
      << blocks.status();
}

TEST(ScriptModel, RebuildGivesTheStoredBackwardsGradientsAndFrozenPassesKeepStatistics) {
  JobSpec spec = Inspected("revnet_twin.pt");
  auto model = BuildModel(spec.model, 0, 1, 3);  // the two reversible blocks
  ASSERT_TRUE(model.ok()) << model.status();
  auto& block = *(*model)->blocks()[0];
  ASSERT_TRUE(block.reversible());
  auto* rev = dynamic_cast<ScriptBlock*>(&block);
  ASSERT_NE(rev, nullptr);
  // Parameters registered with the scripted module's tensors (renamed).
  EXPECT_TRUE(rev->named_parameters().contains("body_layers_0_weight"));
  EXPECT_EQ(rev->named_parameters()["body_layers_0_weight"].data_ptr(), rev->script()
                                                                            .attr("body")
                                                                            .toModule()
                                                                            .attr("layers")
                                                                            .toModule()
                                                                            .attr("0")
                                                                            .toModule()
                                                                            .attr("weight")
                                                                            .toTensor()
                                                                            .data_ptr());
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({4, 8, 6, 6});
  torch::Tensor dy = torch::randn({4, 8, 6, 6});
  auto stats = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& b : rev->buffers()) out.push_back(b.clone());
    return out;
  };
  auto grads = [&] {
    std::vector<torch::Tensor> out;
    for (const auto& p : rev->parameters()) out.push_back(p.grad().clone());
    for (auto& p : rev->parameters()) p.mutable_grad() = torch::Tensor();
    return out;
  };
  const auto before = stats();
  torch::Tensor y;
  {
    FreezeRunningStats freeze;
    y = rev->forward(x).detach();
  }
  const auto after_frozen = stats();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(before[i].equal(after_frozen[i])) << i;
  // Stored: a graph from x.
  torch::Tensor leaf = x.clone().requires_grad_(true);
  {
    FreezeRunningStats freeze;
    rev->forward(leaf).backward(dy);
  }
  const auto stored = grads();
  const torch::Tensor stored_dx = leaf.grad().clone();
  // Rebuilt from y alone.
  torch::Tensor rebuilt, dx;
  {
    FreezeRunningStats freeze;
    std::tie(rebuilt, dx) = rev->RebuildBackward(y, dy, /*input_grad=*/true);
  }
  const auto rebuilt_grads = grads();
  EXPECT_TRUE(torch::allclose(rebuilt, x, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(dx, stored_dx, 1e-4, 1e-5));
  ASSERT_EQ(stored.size(), rebuilt_grads.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_TRUE(torch::allclose(rebuilt_grads[i], stored[i], 1e-4, 1e-5)) << i;
  }
  const auto after = stats();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(before[i].equal(after[i])) << i;
  // Unfrozen, a training-mode forward moves the running statistics once.
  rev->forward(x);
  const auto moved = stats();
  bool any = false;
  for (size_t i = 0; i < before.size(); ++i) any = any || !before[i].equal(moved[i]);
  EXPECT_TRUE(any);
}

}  // namespace
}  // namespace stagewise::models
