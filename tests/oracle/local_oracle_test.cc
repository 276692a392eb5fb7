// Oracle through real child processes: `stagewise local` starts a coordinator
// and J workers, trains; every stage writes its final parameters; they equal
// the single-process reference trainer's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/models/model.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"

namespace stagewise {
namespace {
namespace fs = std::filesystem;

TEST(LocalOracle, ChildProcessStagesEqualTheReference) {
  const fs::path dir =
      fs::temp_directory_path() / ("stagewise_local_oracle_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string yaml = absl::StrCat(R"(name: local-oracle
seed: 9
model: {name: revnet, depth: 18, width: 4, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
algorithm: {name: backprop, micro_batches: 4}
stages: {partition: [[0, 2], [2, 4], [4, 6]]}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 16
steps: 5
checkpoint: {dir: )",
                                        (dir / "out").string(), "}\n");
  const fs::path job = dir / "job.yaml";
  std::ofstream(job) << yaml;
  const std::string cmd =
      absl::StrCat(STAGEWISE_BINARY_DIR, "/bin/stagewise local -o json ", job.string(), " > ",
                   (dir / "stdout").string(), " 2> ", (dir / "stderr").string(), " </dev/null");
  const int status = std::system(cmd.c_str());
  std::stringstream err;
  err << std::ifstream(dir / "stderr").rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err.str();

  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Reference: accumulate over the same 4 micro-batches, step once.
  auto trainer = training::ReferenceTrainer::Create(*spec);
  ASSERT_TRUE(trainer.ok());
  auto& t = **trainer;
  const int64_t per_epoch = t.train_sampler().batches_per_epoch();
  for (int64_t s = 0; s < spec->steps; ++s) {
    data::Batch b = t.train_sampler().Get(s / per_epoch, s % per_epoch);
    t.optimizer().zero_grad();
    auto xs = b.x.split(4), ys = b.y.split(4);
    for (size_t m = 0; m < xs.size(); ++m) {
      (torch::cross_entropy_loss(t.model().forward(xs[m]), ys[m]) * 0.25).backward();
    }
    t.optimizer().step();
  }
  auto want = t.model().named_parameters();

  // The final state is the job's last committed checkpoint:
  // out/<job id>/step-<total>/stage-<j>.pt, each with a "model" archive.
  std::vector<fs::path> jobs;
  for (const auto& e : fs::directory_iterator(dir / "out")) jobs.push_back(e.path());
  ASSERT_EQ(jobs.size(), 1u);
  const std::vector<checkpoint::Committed> committed = checkpoint::ListCommitted(
      (dir / "out").string(), jobs[0].filename().string(), /*verify_checksums=*/true, nullptr);
  ASSERT_FALSE(committed.empty());
  EXPECT_EQ(committed.front().manifest.step(), spec->steps);
  size_t compared = 0;
  for (int j = 0; j < 3; ++j) {
    const auto& [begin, end] = spec->stages.ranges[j];
    auto stage = models::BuildModel(spec->model, spec->seed, begin, end);
    ASSERT_TRUE(stage.ok());
    torch::serialize::InputArchive archive, model;
    archive.load_from(committed.front().dir + "/" + checkpoint::ShardFileName(j));
    ASSERT_TRUE(archive.try_read("model", model)) << j;
    (*stage)->load(model);
    for (const auto& item : (*stage)->named_parameters()) {
      const torch::Tensor& w = want[item.key()];
      const double rel = ((item.value() - w).norm() / w.norm().clamp_min(1e-12)).item<double>();
      EXPECT_LE(rel, 1e-5) << item.key();
      ++compared;
    }
  }
  EXPECT_EQ(compared, want.size());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stagewise
