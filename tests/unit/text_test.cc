// The text pieces (docs/text.md): the fortunes corpus and a user's file, the
// split and the seeded batches of byte sequences; the gpt and reformer
// blocks (parameter counts, causality, exact inverses, the fused rebuild and
// backward, any sequence length); and the loss over every position.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "services/data/dataset.h"
#include "services/models/loss.h"
#include "services/models/model.h"
#include "services/models/plan.h"
#include "services/models/transformer.h"

namespace stagewise {
namespace {

using ::testing::HasSubstr;

DataSpec Fortunes(int64_t sequence_length = 32) {
  DataSpec d;
  d.dataset = DatasetKind::kFortunes;
  d.sequence_length = sequence_length;
  d.train_size = 64;
  return d;
}

TEST(TextData, FortunesIsTheRecordedCorpusSplitNinetyFiveFive) {
  auto corpus = data::ReadFortunes(data::kDefaultFortunesDir);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(corpus->size(), 2546242u);
  EXPECT_EQ(corpus->find("\n%\n"), std::string::npos);  // separators removed
  auto sets = data::LoadDatasets(Fortunes(), 1);
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_EQ(sets->num_classes, 256);
  EXPECT_EQ(sets->train.text.numel(), 2546242 * 90 / 100);
  EXPECT_EQ(sets->test.text.numel(), 2546242 * 95 / 100 - 2546242 * 90 / 100);
  DataSpec test_split = Fortunes();
  test_split.eval_split = TextSplit::kTest;
  auto other = data::LoadDatasets(test_split, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->test.text.numel(), 2546242 - 2546242 * 95 / 100);
  // The held-out part starts where training ends.
  EXPECT_EQ(sets->test.text[0].item<int>(),
            static_cast<uint8_t>((*corpus)[static_cast<size_t>(2546242 * 90 / 100)]));
}

TEST(TextData, AnotherCorpusInTheFortunesDirectoryIsRefused) {
  const std::string dir = ::testing::TempDir() + "/fortunes_fake";
  std::filesystem::create_directories(dir);
  auto status = data::ReadFortunes(dir);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.status().message()), HasSubstr("fortunes package"));
  std::filesystem::remove_all(dir);
}

TEST(TextData, TrainingBatchesAreSeededWindowsWithTheNextByteAsTarget) {
  auto sets = data::LoadDatasets(Fortunes(), 1);
  ASSERT_TRUE(sets.ok());
  JobSpec spec;
  spec.data = Fortunes();
  spec.batch_size = 8;
  spec.seed = 3;
  data::BatchSampler sampler(sets->train, data::TrainSamplerOptions(spec, *sets));
  EXPECT_EQ(sampler.batches_per_epoch(), 64 / 8);
  data::Batch a = sampler.Get(0, 1), again = sampler.Get(0, 1), other = sampler.Get(1, 1);
  ASSERT_EQ(a.x.sizes(), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(a.x.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(a.x, again.x));
  EXPECT_FALSE(torch::equal(a.x, other.x));
  // y is x shifted by one byte: both come from one window of the corpus.
  EXPECT_TRUE(torch::equal(a.x.narrow(1, 1, 31), a.y.narrow(1, 0, 31)));
  // Every window lies in the training split.
  const std::string train(reinterpret_cast<const char*>(sets->train.text.data_ptr<uint8_t>()),
                          sets->train.text.numel());
  std::string first(32, '\0');
  for (int i = 0; i < 32; ++i) first[i] = static_cast<char>(a.x[0][i].item<int64_t>());
  EXPECT_NE(train.find(first), std::string::npos);
}

TEST(TextData, VaryingLengthsChangeBetweenMiniBatchesWithinBounds) {
  DataSpec d = Fortunes();
  d.min_sequence_length = 4;
  auto sets = data::LoadDatasets(d, 1);
  ASSERT_TRUE(sets.ok());
  JobSpec spec;
  spec.data = d;
  spec.batch_size = 4;
  data::BatchSampler sampler(sets->train, data::TrainSamplerOptions(spec, *sets));
  std::set<int64_t> lengths;
  for (int64_t i = 0; i < sampler.batches_per_epoch(); ++i) {
    data::Batch b = sampler.Get(0, i);
    EXPECT_EQ(b.x.sizes(), b.y.sizes());
    EXPECT_GE(b.x.size(1), 4);
    EXPECT_LE(b.x.size(1), 32);
    lengths.insert(b.x.size(1));
  }
  EXPECT_GT(lengths.size(), 3u);
}

TEST(TextData, HeldOutWindowsCoverTheSplitInOrderWithAShorterLast) {
  auto sets = data::LoadDatasets(Fortunes(16), 1);
  ASSERT_TRUE(sets.ok());
  JobSpec spec;
  spec.data = Fortunes(16);
  spec.batch_size = 4;
  spec.eval_batch_size = 1000;
  data::BatchSampler sampler(sets->test, data::TestSamplerOptions(spec, *sets));
  const int64_t bytes = sets->test.text.numel();  // 127312: 7956 windows and 15 bytes
  ASSERT_EQ((bytes - 1) % 16, 15);
  const int64_t n = sampler.batches_per_epoch();
  EXPECT_EQ(n, (7956 + 999) / 1000 + 1);
  int64_t targets = 0;
  for (int64_t i = 0; i < n; ++i) targets += sampler.Get(0, i).y.numel();
  EXPECT_EQ(targets, bytes - 1);  // every byte but the first is a target once
  data::Batch last = sampler.Get(0, n - 1);
  EXPECT_EQ(last.x.sizes(), (std::vector<int64_t>{1, 15}));
  EXPECT_EQ(last.y[0][14].item<int64_t>(), sets->test.text[bytes - 1].item<int64_t>());
}

TEST(TextData, AUserFileTooShortForTheSequenceNamesTheKey) {
  const std::string path = ::testing::TempDir() + "/short.txt";
  std::ofstream(path) << "A short text of a few dozen bytes, not enough.";
  DataSpec d;
  d.dataset = DatasetKind::kTextFile;
  d.path = path;
  d.sequence_length = 64;
  auto sets = data::LoadDatasets(d, 1);
  ASSERT_FALSE(sets.ok());
  EXPECT_THAT(std::string(sets.status().message()), HasSubstr("data.sequence_length"));
  d.path = path + ".missing";
  sets = data::LoadDatasets(d, 1);
  ASSERT_FALSE(sets.ok());
  EXPECT_THAT(std::string(sets.status().message()), HasSubstr("data.path"));
  std::remove(path.c_str());
}

ModelSpec TextModel(ModelKind kind, int depth = 2, int width = 16, int heads = 4) {
  ModelSpec m;
  m.name = kind;
  m.depth = depth;
  m.width = width;
  m.heads = heads;
  m.input_shape = {12};
  m.num_classes = 256;
  return m;
}

TEST(TextModels, ParameterCountsMatchThePlanAndTheFormula) {
  for (ModelKind kind : {ModelKind::kGpt, ModelKind::kReformer}) {
    auto plan = models::PlanModel(TextModel(kind));
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto model = models::BuildModel(TextModel(kind), 1);
    ASSERT_TRUE(model.ok()) << model.status();
    for (const auto& b : (*model)->blocks()) {
      EXPECT_EQ(b->num_parameters(), static_cast<int64_t>(models::EstimateParameters(b->info())))
          << b->info().kind;
    }
  }
  // One GPT block of width 16: 12 w^2 + 13 w.
  auto gpt = models::BuildModel(TextModel(ModelKind::kGpt), 1, 1, 2);
  ASSERT_TRUE(gpt.ok());
  EXPECT_EQ((*gpt)->num_parameters(), 12 * 16 * 16 + 13 * 16);
}

TEST(TextModels, ThePastDoesNotSeeTheFuture) {
  for (ModelKind kind : {ModelKind::kGpt, ModelKind::kReformer}) {
    auto model = models::BuildModel(TextModel(kind), 2);
    ASSERT_TRUE(model.ok());
    torch::Tensor x = torch::randint(256, {2, 12}, torch::kLong);
    torch::Tensor changed = x.clone();
    changed.select(1, 8).fill_(7);
    changed.select(1, 11).fill_(9);
    torch::Tensor a = (*model)->forward(x), b = (*model)->forward(changed);
    ASSERT_EQ(a.sizes(), (std::vector<int64_t>{2, 12, 256}));
    EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 8), b.narrow(1, 0, 8), 1e-6, 1e-6));
    EXPECT_FALSE(torch::allclose(a.narrow(1, 8, 4), b.narrow(1, 8, 4)));
    // Shorter sequences go through the same model.
    EXPECT_EQ((*model)->forward(x.narrow(1, 0, 5)).sizes(), (std::vector<int64_t>{2, 5, 256}));
  }
  auto model = models::BuildModel(TextModel(ModelKind::kGpt), 2);
  EXPECT_THROW((*model)->forward(torch::zeros({1, 13}, torch::kLong)), c10::Error);
}

TEST(TextModels, ReversibleBlockInverseAndFusedRebuildMatchAutograd) {
  torch::manual_seed(4);
  models::BlockInfo info;
  info.kind = "rev_transformer";
  info.reversible = true;
  info.in_channels = 32;
  info.out_channels = 16;
  info.mid_channels = 64;
  info.heads = 4;
  info.in_shape = info.out_shape = {10, 32};
  auto block = std::dynamic_pointer_cast<models::ReversibleBlock>(models::MakeBlock(info));
  ASSERT_TRUE(block);
  torch::Tensor x = torch::randn({3, 10, 32}, torch::kDouble);
  block->to(torch::kDouble);
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = block->forward(x);
    EXPECT_LT((block->inverse(y) - x).abs().max().item<double>(), 1e-12);
  }
  // Autograd on the forward against the one-pass rebuild + backward.
  torch::Tensor dy = torch::randn_like(y);
  torch::Tensor xin = x.clone().requires_grad_(true);
  block->zero_grad();
  block->forward(xin).backward(dy);
  std::vector<torch::Tensor> want;
  for (auto& p : block->parameters()) want.push_back(p.grad().clone());
  torch::Tensor want_dx = xin.grad().clone();
  block->zero_grad();
  auto [rebuilt, dx] = block->RebuildBackward(y, dy, true);
  EXPECT_LT((rebuilt - x).abs().max().item<double>(), 1e-12);
  EXPECT_LT((dx - want_dx).abs().max().item<double>(), 1e-10);
  auto params = block->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LT((params[i].grad() - want[i]).abs().max().item<double>(), 1e-10) << i;
  }
}

// docs/text.md, "Rebuild error": float32 inputs rebuilt through a stack of k
// reversible Transformer blocks (width 64, 4 heads, 64 positions, batch 8,
// the zoo's initialisation, inputs from the embedding of random bytes).
// Prints max |x - x'| / max |x| per k; run it to see the numbers:
//   build/tests/text_test --gtest_filter='*RebuildError*'
TEST(TextModels, RebuildErrorThroughKReversibleBlocksStaysSmallInFloat32) {
  ModelSpec spec = TextModel(ModelKind::kReformer, /*depth=*/64, /*width=*/64, /*heads=*/4);
  spec.input_shape = {64};
  auto model = models::BuildModel(spec, 9);
  ASSERT_TRUE(model.ok()) << model.status();
  torch::NoGradGuard no_grad;
  const auto& blocks = (*model)->blocks();
  torch::Tensor x = blocks[0]->forward(torch::randint(256, {8, 64}, torch::kLong));
  for (int k : {1, 4, 16, 64}) {
    torch::Tensor h = x;
    for (int i = 1; i <= k; ++i) h = blocks[i]->forward(h);
    const double top = h.abs().max().item<double>();
    for (int i = k; i >= 1; --i) h = blocks[i]->inverse(h);
    const double error = (h - x).abs().max().item<double>();
    const double relative = error / x.abs().max().item<double>();
    std::printf(
        "rebuild through %2d reversible blocks: max |x - x'| = %.2e, %.2e of max |x|, "
        "%.2e of the top activation\n",
        k, error, relative, error / top);
    // Grows with depth (each inverse subtracts a function of a rebuilt value),
    // from float32 rounding at one block to a few parts in a thousand at 64.
    EXPECT_LT(relative, k == 1 ? 1e-5 : 1e-2) << k;
  }
}

TEST(TextModels, LossAveragesOverEveryPosition) {
  torch::Tensor logits = torch::randn({2, 3, 5});
  torch::Tensor y = torch::randint(5, {2, 3}, torch::kLong);
  const double want =
      torch::cross_entropy_loss(logits.reshape({6, 5}), y.reshape({6})).item<double>();
  EXPECT_NEAR(models::CrossEntropy(logits, y).item<double>(), want, 1e-6);
  EXPECT_NEAR(models::CrossEntropy(logits, y, true).item<double>(), 6 * want, 1e-5);
  EXPECT_EQ(models::CountCorrect(logits, logits.argmax(-1)), 6);
}

}  // namespace
}  // namespace stagewise
