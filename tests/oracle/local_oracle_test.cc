// Oracle through real child processes: `stagewise local` starts a coordinator
// and J workers (J x R with replicated stages, whose replicas average their
// gradients over gloo between the processes), trains; every stage writes its
// final parameters; they equal the single-process reference trainer's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/models/model.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"

namespace stagewise {
namespace {
namespace fs = std::filesystem;

using Step = std::function<void(training::ReferenceTrainer&, const data::Batch&)>;

// Trains the single-process reference on `yaml` with `step` (once per
// mini-batch), runs `stagewise local` on the same job (its checkpoint.dir is
// dir/out) and compares the final committed checkpoint's parameters, stage by
// stage, with the reference's (by global name) within 1e-5 relative.
void ExpectLocalRunEqualsReference(const fs::path& dir, const std::string& yaml, const Step& step) {
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto trainer = training::ReferenceTrainer::Create(*spec);
  ASSERT_TRUE(trainer.ok());
  auto& t = **trainer;
  const int64_t per_epoch = t.train_sampler().batches_per_epoch();
  for (int64_t s = 0; s < spec->steps; ++s) {
    step(t, t.train_sampler().Get(s / per_epoch, s % per_epoch));
  }
  std::map<std::string, torch::Tensor> want;
  for (const auto& item : t.model().named_parameters()) want[item.key()] = item.value().detach();

  const fs::path job = dir / "job.yaml";
  std::ofstream(job) << yaml;
  const std::string cmd =
      absl::StrCat(STAGEWISE_BINARY_DIR, "/bin/stagewise local -o json ", job.string(), " > ",
                   (dir / "stdout").string(), " 2> ", (dir / "stderr").string(), " </dev/null");
  const int status = std::system(cmd.c_str());
  std::stringstream err;
  err << std::ifstream(dir / "stderr").rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err.str();

  // The final state is the job's last committed checkpoint:
  // out/<job id>/step-<total>/stage-<j>.pt, each with a "model" archive
  // (replica 0's: every replica of a stage holds the same parameters).
  std::vector<fs::path> jobs;
  for (const auto& e : fs::directory_iterator(dir / "out")) jobs.push_back(e.path());
  ASSERT_EQ(jobs.size(), 1u);
  const std::vector<checkpoint::Committed> committed = checkpoint::ListCommitted(
      (dir / "out").string(), jobs[0].filename().string(), /*verify_checksums=*/true, nullptr);
  ASSERT_FALSE(committed.empty());
  EXPECT_EQ(committed.front().manifest.step(), spec->steps);
  size_t compared = 0;
  for (size_t j = 0; j < spec->stages.ranges.size(); ++j) {
    const auto& [begin, end] = spec->stages.ranges[j];
    auto stage = models::BuildModel(spec->model, spec->seed, begin, end);
    ASSERT_TRUE(stage.ok());
    torch::serialize::InputArchive archive, model;
    archive.load_from(committed.front().dir + "/" + checkpoint::ShardFileName(static_cast<int>(j)));
    ASSERT_TRUE(archive.try_read("model", model)) << j;
    (*stage)->load(model);
    for (const auto& item : (*stage)->named_parameters()) {
      ASSERT_TRUE(want.count(item.key())) << item.key();
      const torch::Tensor& w = want[item.key()];
      const double rel = ((item.value() - w).norm() / w.norm().clamp_min(1e-12)).item<double>();
      EXPECT_LE(rel, 1e-5) << item.key();
      ++compared;
    }
  }
  EXPECT_EQ(compared, want.size());
}

fs::path FreshDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / absl::StrCat("stagewise_", name, "_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(LocalOracle, ChildProcessStagesEqualTheReference) {
  const fs::path dir = FreshDir("local_oracle");
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
  // Reference: accumulate over the same 4 micro-batches, step once.
  ExpectLocalRunEqualsReference(dir, yaml, [](training::ReferenceTrainer& t, const data::Batch& b) {
    t.optimizer().zero_grad();
    auto xs = b.x.split(4), ys = b.y.split(4);
    for (size_t m = 0; m < xs.size(); ++m) {
      (torch::cross_entropy_loss(t.model().forward(xs[m]), ys[m]) * 0.25).backward();
    }
    t.optimizer().step();
  });
  fs::remove_all(dir);
}

// 2 stages x 2 replicas: four worker processes, each replica's pipeline
// training on its half of every mini-batch and the two replicas of each stage
// averaging their gradients over gloo's TCP (rendezvous through the
// coordinator) before every step; against the reference on the whole batch.
// A Transformer without BatchNorm: a replica's share is a slice of the
// batch's mean loss.
TEST(LocalOracle, ReplicatedChildProcessesEqualTheReference) {
  const fs::path dir = FreshDir("local_replicas_oracle");
  const std::string yaml = absl::StrCat(R"(name: local-replicas-oracle
seed: 7
model: {name: gpt, depth: 2, width: 16, heads: 2}
data: {dataset: fortunes, sequence_length: 16, train_size: 64, limit_test: 4}
algorithm: backprop
stages: {partition: [[0, 2], [2, 4]], replicas: 2}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 8
steps: 5
eval: {every_epochs: 0, at_end: false}
checkpoint: {dir: )",
                                        (dir / "out").string(), "}\n");
  ExpectLocalRunEqualsReference(
      dir, yaml, [](training::ReferenceTrainer& t, const data::Batch& b) { t.Step(b, 0.05); });
  std::stringstream out;
  out << std::ifstream(dir / "stdout").rdbuf();
  EXPECT_NE(out.str().find("\"replicas\":2"), std::string::npos) << out.str();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stagewise
