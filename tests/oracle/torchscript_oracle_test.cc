// Oracle (docs/torchscript.md): a TorchScript copy of a zoo model, started from
// the zoo model's initial weights, trains to the zoo model's parameters and
// BatchNorm statistics. Both jobs run on the in-process cluster with real gRPC
// between two stages, under backprop (1F1B, 2 micro-batches) and PETRA, so the
// scripted blocks go through every path the zoo blocks go through: stored
// graphs, graph-free forwards with frozen statistics, and rebuilding inputs
// with the scripted `inverse`.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/models/model.h"
#include "services/models/script_model.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise {
namespace {
namespace fs = std::filesystem;

// blocks: 0 stem, 1-2 reversible, 3-5 pair downsample, 6 head (the fixture
// revnet_twin.pt is this model, module for module).
std::string Job(const std::string& model, const std::string& algorithm) {
  return absl::StrCat(R"(name: torchscript-oracle
seed: 7
model: )",
                      model, R"(
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [1, 8, 8], classes: 10}
algorithm: )",
                      algorithm, R"(
stages: {partition: [[0, 3], [3, 7]]}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
batch_size: 16
steps: 6
eval: {every_epochs: 0, at_end: false}
)");
}

constexpr char kZoo[] = "{name: revnet, width: 4, blocks: [2, 1, 1, 1]}";

class TorchScriptOracle : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("stagewise_ts_oracle_", ::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The fixture with the zoo model's initial weights and statistics copied in.
  std::string ScriptCopyOfZoo(const JobSpec& zoo) {
    auto model = models::BuildModel(zoo.model, static_cast<uint64_t>(zoo.seed));
    EXPECT_TRUE(model.ok()) << model.status();
    torch::jit::Module script = torch::jit::load(
        absl::StrCat(STAGEWISE_SOURCE_DIR, "/tests/fixtures/torchscript/revnet_twin.pt"));
    auto blocks = script.attr("blocks").toModule().named_children();
    const auto& zoo_blocks = (*model)->blocks();
    EXPECT_EQ(blocks.size(), zoo_blocks.size());
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (const auto& block : blocks) {
      auto params = zoo_blocks[i]->named_parameters();
      auto buffers = zoo_blocks[i]->named_buffers();
      size_t copied = 0;
      for (const auto& p : block.value.named_parameters()) {
        EXPECT_TRUE(params.contains(p.name)) << "block " << i << ": " << p.name;
        if (params.contains(p.name)) p.value.copy_(params[p.name]), ++copied;
      }
      for (const auto& b : block.value.named_buffers()) {
        EXPECT_TRUE(buffers.contains(b.name)) << "block " << i << ": " << b.name;
        if (buffers.contains(b.name)) b.value.copy_(buffers[b.name]), ++copied;
      }
      EXPECT_EQ(copied, params.size() + buffers.size()) << "block " << i;
      ++i;
    }
    const std::string path = (dir_ / "revnet_twin_zoo_init.pt").string();
    script.save(path);
    return path;
  }

  fs::path dir_;
};

TEST_P(TorchScriptOracle, TrainsToTheZooTwinsParameters) {
  const std::string algorithm = GetParam();
  const std::string zoo_yaml = Job(kZoo, algorithm);
  auto zoo = ParseJobSpec(zoo_yaml);
  ASSERT_TRUE(zoo.ok()) << zoo.status();
  const std::string file = ScriptCopyOfZoo(*zoo);
  std::string script_yaml =
      Job(absl::StrCat("{name: torchscript, path: \"", file, "\"}"), algorithm);
  auto script = ParseJobSpec(script_yaml);
  ASSERT_TRUE(script.ok()) << script.status();
  // What the CLI does before it submits: the dry run, as a script_model section.
  script->model.script_file = file;
  script->model.script_bytes = static_cast<int64_t>(fs::file_size(file));
  auto blocks = models::InspectScriptModel(script->model);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  script->model.script_blocks = *blocks;
  script_yaml += models::ScriptModelSection(script->model);

  const testing::Outcome want = testing::RunJob(zoo_yaml, 2);
  const testing::Outcome got = testing::RunJob(script_yaml, 2);
  ASSERT_FALSE(want.tensors.empty());
  // "4.first.body.layers.0.weight" (zoo) is "4.first_body_layers_0_weight" here.
  std::map<std::string, torch::Tensor> renamed;
  for (const auto& [name, t] : want.tensors) {
    const size_t dot = name.find('.');
    renamed[name.substr(0, dot + 1) + absl::StrReplaceAll(name.substr(dot + 1), {{".", "_"}})] = t;
  }
  testing::ExpectClose(got.tensors, renamed, 1e-6);
  // And training moved them: the comparison is not between two untouched models.
  auto start = models::BuildModel(zoo->model, static_cast<uint64_t>(zoo->seed));
  ASSERT_TRUE(start.ok());
  const auto initial = testing::Tensors(**start);
  const auto& w = want.tensors.at("1.body.layers.0.weight");
  EXPECT_GT((w - initial.at("1.body.layers.0.weight")).norm().item<double>(), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, TorchScriptOracle,
                         ::testing::Values("{name: backprop, micro_batches: 2, schedule: 1f1b}",
                                           "{name: petra}"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.index == 0 ? std::string("backprop_1f1b_m2")
                                                  : std::string("petra");
                         });

}  // namespace
}  // namespace stagewise
