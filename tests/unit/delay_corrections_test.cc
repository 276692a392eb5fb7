// DelayCorrections' saved state: w_prev goes out and comes back exactly, and
// a state that does not fit the stage (another parameter count, a count that
// is not an integer) is refused as DATA_LOSS naming the algorithm and what
// did not fit, rather than predicting from the wrong weights.
#include "worker/algorithms/delay_corrections.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/unit/fake_stage_context.h"

namespace stagewise {
namespace {

using testing::FakeJob;
using ::testing::HasSubstr;

constexpr char kJob[] = R"(name: corrections
seed: 3
model: {name: mlp, hidden: [6, 6]}
data: {dataset: synthetic, train_size: 16, test_size: 8, shape: [1, 4, 4], classes: 4}
algorithm: {name: delayed, predict_weights: true}
stages: 2
optimizer: {name: sgd, lr: 0.1}
batch_size: 8
steps: 2
)";

worker::DelayCorrections Predicting() {
  worker::DelayCorrections::Options options;
  options.predict_weights = true;
  return worker::DelayCorrections(options);
}

std::vector<torch::Tensor> StageParameters(testing::FakeStageContext& stage) {
  return stage.model().parameters();
}

// Writes `write` into an archive and reads it back as an InputArchive.
template <typename Write>
std::unique_ptr<torch::serialize::InputArchive> RoundTrip(Write write) {
  torch::serialize::OutputArchive out;
  write(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  auto in = std::make_unique<torch::serialize::InputArchive>();
  std::istringstream read(bytes.str());
  in->load_from(read);
  return in;
}

TEST(DelayCorrections, SavedPreviousWeightsComeBackExactly) {
  auto job = FakeJob::FromYaml(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  testing::FakeStageContext& stage = (*job)->stage(0);
  worker::DelayCorrections saved = Predicting();
  saved.Start(1.0, StageParameters(stage));
  for (torch::Tensor& p : StageParameters(stage)) p.mutable_grad() = torch::ones_like(p);
  ASSERT_TRUE(saved.Step(stage, 0, 0.1).ok());  // takes w_prev, then steps
  std::vector<torch::Tensor> after_step;
  for (const torch::Tensor& p : StageParameters(stage)) after_step.push_back(p.detach().clone());
  auto archive = RoundTrip([&](torch::serialize::OutputArchive& a) { saved.Save(a); });

  worker::DelayCorrections loaded = Predicting();
  loaded.Start(1.0, StageParameters(stage));
  ASSERT_TRUE(loaded.Load(stage, *archive, "delayed").ok());
  EXPECT_EQ(loaded.held_bytes(), saved.held_bytes());
  EXPECT_GT(loaded.held_bytes(), 0);
  // Both predict the same weights: w + s (w - w_prev) from the same w_prev.
  std::vector<torch::Tensor> restore = saved.Predict();
  std::vector<torch::Tensor> predicted_saved;
  for (const torch::Tensor& p : StageParameters(stage))
    predicted_saved.push_back(p.detach().clone());
  saved.Restore(restore);
  restore = loaded.Predict();
  std::vector<torch::Tensor> predicted_loaded = StageParameters(stage);
  ASSERT_EQ(predicted_loaded.size(), predicted_saved.size());
  bool moved = false;
  for (size_t i = 0; i < predicted_saved.size(); ++i) {
    EXPECT_TRUE(torch::equal(predicted_loaded[i], predicted_saved[i])) << "parameter " << i;
    moved = moved || !torch::equal(predicted_saved[i], after_step[i]);
  }
  EXPECT_TRUE(moved) << "the look-ahead moved no parameter";
  loaded.Restore(restore);
}

TEST(DelayCorrections, ACountForAnotherStageIsRefused) {
  auto job = FakeJob::FromYaml(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  testing::FakeStageContext& stage = (*job)->stage(0);
  const int64_t count = static_cast<int64_t>(StageParameters(stage).size());
  auto archive = RoundTrip(
      [&](torch::serialize::OutputArchive& a) { a.write("w_prev.count", c10::IValue(count + 1)); });
  worker::DelayCorrections loaded = Predicting();
  loaded.Start(1.0, StageParameters(stage));
  const absl::Status status = loaded.Load(stage, *archive, "petra");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(absl::StrCat("petra saved w_prev for ", count + 1,
                                     " parameters, the stage has ", count)));
}

TEST(DelayCorrections, ACountThatIsNotAnIntegerIsRefused) {
  auto job = FakeJob::FromYaml(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  testing::FakeStageContext& stage = (*job)->stage(0);
  auto archive = RoundTrip(
      [&](torch::serialize::OutputArchive& a) { a.write("w_prev.count", c10::IValue(2.5)); });
  worker::DelayCorrections loaded = Predicting();
  loaded.Start(1.0, StageParameters(stage));
  const absl::Status status = loaded.Load(stage, *archive, "delayed");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("delayed w_prev.count is not an integer but a Double"));
}

TEST(DelayCorrections, AStateWithoutPreviousWeightsPredictsNothing) {
  auto job = FakeJob::FromYaml(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  testing::FakeStageContext& stage = (*job)->stage(0);
  auto archive = RoundTrip(
      [](torch::serialize::OutputArchive& a) { a.write("other", c10::IValue(int64_t{1})); });
  worker::DelayCorrections loaded = Predicting();
  loaded.Start(1.0, StageParameters(stage));
  ASSERT_TRUE(loaded.Load(stage, *archive, "delayed").ok());
  EXPECT_EQ(loaded.held_bytes(), 0);
  EXPECT_TRUE(loaded.Predict().empty());
}

}  // namespace
}  // namespace stagewise
