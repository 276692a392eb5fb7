// recovery.min_stages (docs/fault_tolerance.md, "Fewer stages"): parsed, and
// refused, naming the key, where a job could not run on fewer stages; and
// recovery.replay ("Replacing one stage"), refused where it cannot work.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

using ::testing::StartsWith;

std::string Yaml(const std::string& stages, const std::string& extra) {
  return absl::StrCat(
      "name: r\nmodel: {name: mlp, hidden: [8, 8, 8]}\n"
      "data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [1, 4, 4]}\n"
      "stages: ",
      stages, "\nbatch_size: 16\nsteps: 2\n", extra);
}

std::string Error(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
  return spec.ok() ? "parsed" : std::string(spec.status().message());
}

TEST(RecoverySpec, MinStagesTakesPlainPipelinesWhoseAlgorithmsFit) {
  auto off = ParseJobSpec(Yaml("4", ""));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->recovery.min_stages, 0);
  auto on = ParseJobSpec(Yaml("4", "recovery: {min_stages: 2}\n"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->recovery.min_stages, 2);
  EXPECT_THAT(Error(Yaml("4", "recovery: {min_stages: 5}\n")),
              StartsWith("recovery.min_stages: must be 0 (off) or 1..stages.count (4), got 5"));
  EXPECT_THAT(Error(Yaml("{count: 2, replicas: 2}", "recovery: {min_stages: 1}\n")),
              StartsWith("recovery.min_stages: not with stages.replicas > 1"));
  EXPECT_THAT(Error(Yaml("4", "algorithm: {name: nwise, n: 3}\nrecovery: {min_stages: 2}\n")),
              StartsWith("recovery.min_stages: nwise with n = 3 needs at least 3 stages, got 2"));
}

TEST(RecoverySpec, ReplayNeedsCheckpointsAndEqualReplicas) {
  auto off = ParseJobSpec(Yaml("4", ""));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->recovery.replay);
  const std::string checkpoints = "checkpoint: {dir: /tmp/c, every_steps: 50}\n";
  auto on = ParseJobSpec(Yaml("4", checkpoints + "recovery: {replay: true}\n"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->recovery.replay);
  EXPECT_THAT(Error(Yaml("4", "recovery: {replay: true}\n")),
              StartsWith("recovery.replay: needs checkpoint.dir"));
  // Replicas: a lost one copies a survivor, which needs them equal at every
  // step's start.
  auto replicas =
      ParseJobSpec(Yaml("{count: 2, replicas: 2}", checkpoints + "recovery: {replay: true}\n"));
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_THAT(Error(Yaml("{count: 2, replicas: 2}",
                         checkpoints + "algorithm: delayed\nrecovery: {replay: true}\n")),
              StartsWith("recovery.replay: with stages.replicas > 1 needs algorithm backprop"));
  EXPECT_THAT(Error(Yaml("{count: 2, replicas: 2}",
                         checkpoints + "sync: {every: 4}\nrecovery: {replay: true}\n")),
              StartsWith("recovery.replay: with stages.replicas > 1 needs sync.every: 1"));
  EXPECT_THAT(Error(Yaml("{count: 2, replicas: 2}",
                         checkpoints + "sync: {overlap: true}\nrecovery: {replay: true}\n")),
              StartsWith("recovery.replay: with stages.replicas > 1: not with sync.overlap"));
  EXPECT_THAT(
      Error(Yaml("{count: 2, chunks_per_worker: 2}",
                 checkpoints +
                     "algorithm: {name: backprop, schedule: interleaved, micro_batches: 4}\n"
                     "recovery: {replay: true}\n")),
      StartsWith("recovery.replay: not with stages.chunks_per_worker > 1"));
  EXPECT_THAT(Error(Yaml("4", checkpoints + "recovery: {replay: yes please}\n")),
              StartsWith("recovery.replay"));
}

}  // namespace
}  // namespace stagewise
