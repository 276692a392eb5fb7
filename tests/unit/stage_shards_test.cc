// StageShards (worker/stage_shards.h): a stage's shard written at a cut and
// read back into a fresh stage, and the checks that refuse a shard that does
// not fit the resume point, on a fake stage (no gRPC, no runtime).
#include "worker/stage_shards.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "tests/unit/fake_stage_context.h"

namespace stagewise {
namespace {

using testing::FakeJob;

class StageShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "shards_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    assignment_.set_stage(0);
    assignment_.set_block_begin(0);
    assignment_.set_block_end(2);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::unique_ptr<FakeJob> MakeJob() {
    auto job = FakeJob::FromYaml(absl::StrCat(R"(name: shards
seed: 3
model: {name: revnet, depth: 18, width: 4, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [3, 8, 8], classes: 4}
algorithm: backprop
stages: 2
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 16
steps: 4
eval: {every_epochs: 0, at_end: false}
checkpoint: {dir: )",
                                              dir_.string(), "}\n"));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? std::move(*job) : nullptr;
  }

  checkpoint::ShardPosition At(int64_t step) const {
    checkpoint::ShardPosition at;
    at.step = step;
    at.phase_step = step;
    at.block_begin = assignment_.block_begin();
    at.block_end = assignment_.block_end();
    return at;
  }

  static v1::ResumePoint Resume(const worker::StageShards::Written& written, int64_t step) {
    v1::ResumePoint resume;
    resume.set_step(step);
    resume.set_phase_step(step);
    resume.set_shard_path(written.path);
    resume.set_shard_bytes(written.bytes);
    resume.set_shard_crc32(written.crc32);
    return resume;
  }

  static std::vector<torch::Tensor> Params(worker::StageContext& stage) {
    std::vector<torch::Tensor> out;
    for (const auto& p : stage.model().parameters()) out.push_back(p.detach().clone());
    return out;
  }

  static bool Same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!torch::equal(a[i], b[i])) return false;
    }
    return true;
  }

  // Trains a job and writes its stage 0's shard after step 2.
  worker::StageShards::Written WriteTrained(std::vector<torch::Tensor>* params) {
    std::unique_ptr<FakeJob> trained = MakeJob();
    for (const absl::Status& s : trained->Run()) EXPECT_TRUE(s.ok()) << s;
    worker::StageShards shards(trained->stage(0), assignment_, torch::kCPU);
    absl::StatusOr<worker::StageShards::Written> written = shards.Write(At(2), nullptr);
    EXPECT_TRUE(written.ok()) << written.status();
    *params = Params(trained->stage(0));
    return written.ok() ? *written : worker::StageShards::Written{};
  }

  std::filesystem::path dir_;
  v1::StageAssignment assignment_;
};

TEST_F(StageShardsTest, AStageWrittenIsReadBackIntoAFreshOne) {
  std::vector<torch::Tensor> trained;
  const worker::StageShards::Written written = WriteTrained(&trained);
  // The one layout (services/checkpoint/checkpoint.h): DIR/JOB/step-N/stage-J.pt.
  EXPECT_EQ(written.path, checkpoint::StepDir(dir_.string(), "fake-job", 2) + "/stage-0.pt");
  EXPECT_TRUE(std::filesystem::exists(written.path));
  EXPECT_GT(written.bytes, 0);

  std::unique_ptr<FakeJob> fresh = MakeJob();
  ASSERT_FALSE(Same(Params(fresh->stage(0)), trained));  // training moved them
  worker::StageShards shards(fresh->stage(0), assignment_, torch::kCPU);
  std::vector<int64_t> entered;
  absl::StatusOr<worker::StageShards::Restored> restored =
      shards.Load(Resume(written, 2), [&](const checkpoint::ShardPosition& at, const std::string&) {
        entered.push_back(at.step);
        return absl::OkStatus();
      });
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(entered, std::vector<int64_t>{2});
  EXPECT_EQ(restored->step, 2);
  EXPECT_EQ(restored->phase_step, 2);
  EXPECT_FALSE(restored->resharded);
  EXPECT_NE(restored->algorithm, nullptr);  // inside the phase: the algorithm's entry
  EXPECT_TRUE(Same(Params(fresh->stage(0)), trained));
}

TEST_F(StageShardsTest, AShardThatDoesNotFitTheResumePointIsRefusedBeforeAnythingLoads) {
  std::vector<torch::Tensor> trained;
  const worker::StageShards::Written written = WriteTrained(&trained);
  std::unique_ptr<FakeJob> fresh = MakeJob();
  const std::vector<torch::Tensor> before = Params(fresh->stage(0));
  worker::StageShards shards(fresh->stage(0), assignment_, torch::kCPU);
  int entered = 0;
  auto enter = [&](const checkpoint::ShardPosition&, const std::string&) {
    ++entered;
    return absl::OkStatus();
  };

  // Another step than the shard's.
  absl::StatusOr<worker::StageShards::Restored> other_step = shards.Load(Resume(written, 3), enter);
  EXPECT_EQ(other_step.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(other_step.status().message().find("the resume point says step 3"), std::string::npos)
      << other_step.status();
  EXPECT_NE(other_step.status().message().find(written.path), std::string::npos);

  // A checksum that is not the file's.
  v1::ResumePoint corrupt = Resume(written, 2);
  corrupt.set_shard_crc32(written.crc32 ^ 1u);
  EXPECT_EQ(shards.Load(corrupt, enter).status().code(), absl::StatusCode::kDataLoss);

  // The job refuses the position (its phases do not have it).
  absl::StatusOr<worker::StageShards::Restored> refused =
      shards.Load(Resume(written, 2), [](const checkpoint::ShardPosition&, const std::string& w) {
        return absl::DataLossError(absl::StrCat(w, ": does not fit"));
      });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);

  EXPECT_EQ(entered, 0);
  EXPECT_TRUE(Same(Params(fresh->stage(0)), before));
}

TEST_F(StageShardsTest, AReplacingStageNeedsTheShardsMessageCounts) {
  std::vector<torch::Tensor> trained;
  const worker::StageShards::Written written = WriteTrained(&trained);  // no marks
  std::unique_ptr<FakeJob> fresh = MakeJob();
  v1::StageAssignment replacing = assignment_;
  replacing.set_replacing(true);
  worker::StageShards shards(fresh->stage(0), replacing, torch::kCPU);
  absl::StatusOr<worker::StageShards::Restored> restored = shards.Load(
      Resume(written, 2),
      [](const checkpoint::ShardPosition&, const std::string&) { return absl::OkStatus(); });
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(restored.status().message().find("no message counts"), std::string::npos)
      << restored.status();
}

}  // namespace
}  // namespace stagewise
