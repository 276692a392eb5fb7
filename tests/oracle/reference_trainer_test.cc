// Oracle for the oracle: the reference trainer's step is plain SGD on the
// autograd gradient of the whole model, and checkpoint/resume is exact.
#include "services/training/reference_trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "absl/strings/str_join.h"
#include "services/checkpoint/checkpoint.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"

namespace stagewise::training {
namespace {

JobSpec SmallJob(const std::string& model) {
  JobSpec spec;
  spec.name = "oracle";
  spec.seed = 42;
  spec.data.dataset = DatasetKind::kSynthetic;
  spec.data.train_size = 512;
  spec.data.test_size = 256;
  spec.data.shape = {3, 8, 8};
  spec.data.classes = 4;
  spec.model.name = *EnumFromName<ModelKind>(model);
  spec.model.depth = 18;
  spec.model.width = 4;
  spec.model.blocks = model == "revnet" ? std::vector<int>{1, 1, 1, 1} : std::vector<int>{};
  spec.model.hidden = {32};
  spec.model.input_shape = {3, 8, 8};
  spec.model.num_classes = 4;
  spec.batch_size = 32;
  spec.steps = 10;
  spec.optimizer.lr = 0.05;
  spec.optimizer.momentum = 0;
  spec.eval.every_epochs = 0;
  return spec;
}

TEST(ReferenceTrainer, StepIsSgdOnTheAutogradGradient) {
  JobSpec spec = SmallJob("revnet");
  auto trainer = ReferenceTrainer::Create(spec);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto independent = models::BuildModel(spec.model, spec.seed);
  ASSERT_TRUE(independent.ok());
  data::Batch batch = (*trainer)->train_sampler().Get(0, 0);

  torch::Tensor loss = torch::cross_entropy_loss((*independent)->forward(batch.x), batch.y);
  loss.backward();
  const double trainer_loss = (*trainer)->Step(batch, 0.05);
  EXPECT_NEAR(trainer_loss, loss.item<double>(), 1e-6);

  auto want = (*independent)->named_parameters();
  for (const auto& item : (*trainer)->model().named_parameters()) {
    torch::Tensor expected = want[item.key()].detach() - 0.05 * want[item.key()].grad();
    EXPECT_TRUE(torch::allclose(item.value(), expected, 1e-5, 1e-6)) << item.key();
  }
}

TEST(ReferenceTrainer, LearnsTheSyntheticTask) {
  JobSpec spec = SmallJob("mlp");
  spec.steps = 60;
  spec.optimizer.momentum = 0.9;
  auto trainer = ReferenceTrainer::Create(spec);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const EvalResult before = (*trainer)->Evaluate();
  auto result = (*trainer)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 60);
  EXPECT_LT(result->test.loss, before.loss);
  EXPECT_GT(result->test.accuracy, 0.9);
  EXPECT_EQ(result->test.samples, 256);
}

TEST(ReferenceTrainer, ResumeFromCheckpointIsExact) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("stagewise_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  JobSpec spec = SmallJob("revnet");
  spec.optimizer.momentum = 0.9;  // optimizer state must survive the restart
  spec.steps = 8;

  auto straight = ReferenceTrainer::Create(spec);
  ASSERT_TRUE(straight.ok());
  ASSERT_TRUE((*straight)->Run().ok());

  spec.checkpoint.dir = dir.string();
  spec.checkpoint.every_steps = 4;
  JobSpec first_half = spec;
  first_half.steps = 4;
  auto a = ReferenceTrainer::Create(first_half);
  ASSERT_TRUE(a.ok());
  auto ra = (*a)->Run();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_FALSE(ra->last_checkpoint.empty());
  // The layout of a distributed job's checkpoints: one committed step
  // directory with one shard holding every block.
  std::vector<std::string> skipped;
  const std::vector<checkpoint::Committed> committed =
      checkpoint::ListCommitted(dir.string(), spec.name, /*verify_checksums=*/true, &skipped);
  ASSERT_EQ(committed.size(), 1u) << absl::StrJoin(skipped, "; ");
  EXPECT_EQ(committed[0].dir, ra->last_checkpoint);
  EXPECT_EQ(committed[0].manifest.step(), 4);
  ASSERT_EQ(committed[0].manifest.shards_size(), 1);
  EXPECT_EQ(committed[0].manifest.shards(0).block_end(), (*a)->model().size());

  auto b = ReferenceTrainer::Create(spec);
  ASSERT_TRUE(b.ok());
  auto rb = (*b)->Run();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ((*b)->step(), 8);

  auto want = (*straight)->model().named_parameters();
  for (const auto& item : (*b)->model().named_parameters()) {
    EXPECT_TRUE(torch::allclose(item.value(), want[item.key()], 1e-6, 1e-7)) << item.key();
  }
  auto buffers = (*straight)->model().named_buffers();
  for (const auto& item : (*b)->model().named_buffers()) {
    EXPECT_TRUE(torch::allclose(item.value(), buffers[item.key()])) << item.key();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stagewise::training
