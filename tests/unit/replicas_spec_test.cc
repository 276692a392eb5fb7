// stages.replicas (docs/replicas.md): parsed, and the rules that involve the
// batch size, micro-batches and the algorithm, each error naming its key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

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

TEST(ReplicasSpec, AuxNetIsRefusedWithTheReason) {
  auto spec = ParseJobSpec(Yaml("{count: 2, replicas: 2}", 16, "auxnet"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("stages.replicas"));
  EXPECT_THAT(spec.status().message(), HasSubstr("auxnet"));
}

TEST(ReplicasSpec, UnknownStagesKeyStillNamesTheKnownOnes) {
  auto spec = ParseJobSpec(Yaml("{count: 2, replica: 2}", 16));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("stages.replica"));
}

}  // namespace
}  // namespace stagewise
