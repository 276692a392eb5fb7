// stages.replicas (docs/replicas.md): parsed, and the rules that involve the
// batch size, micro-batches and the algorithm, each error naming its key;
// sync (the outer synchronisation) and recovery.elastic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

using ::testing::HasSubstr;

std::string Yaml(const std::string& stages, int batch, const std::string& algorithm = "backprop") {
  return absl::StrCat(
      "name: r\nmodel: {name: revnet, depth: 18, width: 4}\n"
      "data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}\n"
      "algorithm: ",
      algorithm, "\nstages: ", stages, "\nbatch_size: ", batch, "\nsteps: 2\n");
}

TEST(ReplicasSpec, DefaultsToOneAndReadsTheKey) {
  auto one = ParseJobSpec(Yaml("2", 16));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->stages.replicas, 1);
  auto four = ParseJobSpec(Yaml("{count: 2, replicas: 4}", 16));
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->stages.count, 2);
  EXPECT_EQ(four->stages.replicas, 4);
}

TEST(ReplicasSpec, ReplicasMustDivideTheBatch) {
  auto spec = ParseJobSpec(Yaml("{count: 2, replicas: 3}", 16));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("stages.replicas"));
  EXPECT_THAT(spec.status().message(), HasSubstr("does not divide batch_size 16"));
}

TEST(ReplicasSpec, OutOfRangeIsRefused) {
  for (const char* r : {"0", "-1", "65"}) {
    auto spec = ParseJobSpec(Yaml(absl::StrCat("{count: 2, replicas: ", r, "}"), 128));
    ASSERT_FALSE(spec.ok()) << r;
    EXPECT_THAT(spec.status().message(), HasSubstr("stages.replicas")) << r;
  }
}

TEST(ReplicasSpec, MicroBatchesSplitAReplicasShare) {
  EXPECT_TRUE(
      ParseJobSpec(Yaml("{count: 2, replicas: 4}", 16, "{name: backprop, micro_batches: 4}")).ok());
  auto spec =
      ParseJobSpec(Yaml("{count: 2, replicas: 4}", 16, "{name: backprop, micro_batches: 8}"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("algorithm.micro_batches"));
  EXPECT_THAT(spec.status().message(), HasSubstr("batch_size / stages.replicas (4)"));
}

TEST(ReplicasSpec, AuxNetRunsReplicatedButNotWithOuterSync) {
  auto plain = ParseJobSpec(Yaml("{count: 2, replicas: 2}", 16, "auxnet"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto spec = ParseJobSpec(Yaml("{count: 2, replicas: 2}", 16, "auxnet") + "sync: {every: 4}\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("sync.every"));
  EXPECT_THAT(spec.status().message(), HasSubstr("auxnet averages every step"));
}

TEST(ReplicasSpec, UnknownStagesKeyStillNamesTheKnownOnes) {
  auto spec = ParseJobSpec(Yaml("{count: 2, replica: 2}", 16));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("stages.replica"));
}

TEST(ReplicasSpec, SyncDefaultsToEveryStepAndReadsTheOuterOptimizer) {
  auto plain = ParseJobSpec(Yaml("{count: 2, replicas: 2}", 16));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->sync.every, 1);
  EXPECT_EQ(plain->sync.outer, OuterOptimizer::kNesterov);
  EXPECT_FALSE(plain->sync.overlap);
  EXPECT_DOUBLE_EQ(plain->sync.bucket_mb, 25);
  EXPECT_FALSE(plain->recovery.elastic);
  auto after =
      ParseJobSpec(Yaml("{count: 2, replicas: 2}", 16) + "sync: {overlap: true, bucket_mb: 0.5}\n");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->sync.overlap);
  EXPECT_DOUBLE_EQ(after->sync.bucket_mb, 0.5);
  auto diloco = ParseJobSpec(Yaml("{count: 2, replicas: 2}", 16) +
                             "sync: {every: 10, outer: sgd, lr: 1.0, momentum: 0}\n"
                             "recovery: {elastic: true}\n");
  ASSERT_TRUE(diloco.ok()) << diloco.status();
  EXPECT_EQ(diloco->sync.every, 10);
  EXPECT_EQ(diloco->sync.outer, OuterOptimizer::kSgd);
  EXPECT_DOUBLE_EQ(diloco->sync.lr, 1.0);
  EXPECT_DOUBLE_EQ(diloco->sync.momentum, 0.0);
  EXPECT_TRUE(diloco->recovery.elastic);
}

TEST(ReplicasSpec, SyncErrorsNameTheirKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{every: 0}", "sync.every: must be in [1, 1000000], got 0"},
      {"{every: 4, momentum: 1}", "sync.momentum: must be in [0, 1), got 1"},
      {"{every: 4, lr: 0}", "sync.lr: must be in (0, 1000], got 0"},
      {"{every: 4, outer: nesterov, momentum: 0}", "sync.momentum: outer: nesterov needs"},
      {"{every: 4, outer: adam}", "sync.outer"},
      {"{evry: 4}", "sync.evry"},
      {"{bucket_mb: 0}", "sync.bucket_mb: must be in (0, 1024], got 0"},
      {"{bucket_mb: 2048}", "sync.bucket_mb: must be in (0, 1024], got 2048"},
      {"{overlap: maybe}", "sync.overlap"},
  };
  for (const auto& [sync, want] : bad) {
    auto spec = ParseJobSpec(Yaml("{count: 2, replicas: 2}", 16) + "sync: " + sync + "\n");
    ASSERT_FALSE(spec.ok()) << sync;
    EXPECT_THAT(spec.status().message(), HasSubstr(want)) << sync;
  }
  // Nothing to synchronise with one replica.
  auto alone = ParseJobSpec(Yaml("2", 16) + "sync: {every: 4}\n");
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(alone.status().message(), HasSubstr("sync.every: is 4: needs stages.replicas > 1"));
}

}  // namespace
}  // namespace stagewise
