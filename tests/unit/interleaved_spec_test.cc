// stages.chunks_per_worker and algorithm.schedule: interleaved
// (docs/algorithms.md, "Interleaved 1F1B"): parsed, the virtual stage count,
// explicit ranges of virtual stages, and the rules across keys, each error
// naming its key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

using ::testing::HasSubstr;

std::string Yaml(const std::string& stages, const std::string& algorithm,
                 const std::string& extra = "") {
  return absl::StrCat(
      "name: i\nmodel: {name: emulated, depth: 8}\n"
      "data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [2, 4, 4]}\n"
      "algorithm: ",
      algorithm, "\nstages: ", stages, "\nbatch_size: 16\nsteps: 2\n", extra);
}

const char* const kInterleaved = "{name: backprop, micro_batches: 4, schedule: interleaved}";

TEST(InterleavedSpec, ChunksMultiplyTheStages) {
  auto spec = ParseJobSpec(Yaml("{count: 2, chunks_per_worker: 2}", kInterleaved));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->stages.count, 2);
  EXPECT_EQ(spec->stages.chunks_per_worker, 2);
  EXPECT_EQ(VirtualStages(spec->stages), 4);
  EXPECT_EQ(spec->algorithm.get_if<BackpropOptions>()->schedule, PipelineSchedule::kInterleaved);
  auto plain = ParseJobSpec(Yaml("3", "backprop"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->stages.chunks_per_worker, 1);
  EXPECT_EQ(VirtualStages(plain->stages), 3);
}

TEST(InterleavedSpec, ExplicitRangesAreTheVirtualStages) {
  const std::string ranges = "partition: [[0, 2], [2, 4], [4, 6], [6, 9]]";
  auto implied =
      ParseJobSpec(Yaml(absl::StrCat("{chunks_per_worker: 2, ", ranges, "}"), kInterleaved));
  ASSERT_TRUE(implied.ok()) << implied.status();
  EXPECT_EQ(implied->stages.count, 2);
  EXPECT_EQ(implied->stages.ranges.size(), 4u);
  auto given = ParseJobSpec(
      Yaml(absl::StrCat("{count: 2, chunks_per_worker: 2, ", ranges, "}"), kInterleaved));
  ASSERT_TRUE(given.ok()) << given.status();
  auto wrong = ParseJobSpec(
      Yaml(absl::StrCat("{count: 4, chunks_per_worker: 2, ", ranges, "}"), kInterleaved));
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("stages.count"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("4 x 2 chunks does not match the 4 ranges"));
  auto odd = ParseJobSpec(
      Yaml("{chunks_per_worker: 2, partition: [[0, 3], [3, 6], [6, 9]]}", kInterleaved));
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(odd.status().message(), HasSubstr("stages.partition"));
  EXPECT_THAT(odd.status().message(), HasSubstr("not a multiple of stages.chunks_per_worker"));
}

TEST(InterleavedSpec, ChunksAndTheScheduleGoTogether) {
  auto chunks_alone = ParseJobSpec(Yaml("{count: 2, chunks_per_worker: 2}",
                                        "{name: backprop, micro_batches: 4, schedule: 1f1b}"));
  ASSERT_FALSE(chunks_alone.ok());
  EXPECT_THAT(chunks_alone.status().message(), HasSubstr("stages.chunks_per_worker"));
  EXPECT_THAT(chunks_alone.status().message(), HasSubstr("schedule: interleaved"));
  auto petra = ParseJobSpec(Yaml("{count: 2, chunks_per_worker: 2}", "petra"));
  ASSERT_FALSE(petra.ok());
  EXPECT_THAT(petra.status().message(), HasSubstr("stages.chunks_per_worker"));
  auto schedule_alone = ParseJobSpec(Yaml("2", kInterleaved));
  ASSERT_FALSE(schedule_alone.ok());
  EXPECT_THAT(schedule_alone.status().message(), HasSubstr("algorithm.schedule"));
  EXPECT_THAT(schedule_alone.status().message(), HasSubstr("chunks_per_worker >= 2"));
}

TEST(InterleavedSpec, MicroBatchesComeInGroupsOfTheWorkerCount) {
  auto spec = ParseJobSpec(Yaml("{count: 3, chunks_per_worker: 2}", kInterleaved));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("algorithm.micro_batches"));
  EXPECT_THAT(spec.status().message(), HasSubstr("multiple of stages.count (3), got 4"));
}

TEST(InterleavedSpec, WhatIsNotSupportedYetIsRefusedByName) {
  struct Refused {
    std::string stages, extra, key;
  };
  for (const Refused& r : {
           Refused{"{count: 2, chunks_per_worker: 2, replicas: 2}", "", "stages.replicas"},
           Refused{"{count: 2, chunks_per_worker: 2, partition: auto}", "", "stages.partition"},
           Refused{"{count: 2, chunks_per_worker: 2, memory_budget: 1GiB}", "",
                   "stages.memory_budget"},
           Refused{"{count: 2, chunks_per_worker: 0}", "", "stages.chunks_per_worker"},
           Refused{"{count: 2, chunks_per_worker: 17}", "", "stages.chunks_per_worker"},
       }) {
    auto spec = ParseJobSpec(Yaml(r.stages, kInterleaved, r.extra));
    ASSERT_FALSE(spec.ok()) << r.stages;
    EXPECT_THAT(spec.status().message(), HasSubstr(r.key)) << r.stages;
  }
}

TEST(InterleavedSpec, EveryPhaseMustBeInterleaved) {
  const std::string phases =
      "phases:\n"
      "  - {name: a, steps: 1, algorithm: {name: backprop, micro_batches: 4, schedule: "
      "interleaved}}\n"
      "  - {name: b, steps: 1, algorithm: {name: backprop, micro_batches: 4}}\n";
  std::string yaml = Yaml("{count: 2, chunks_per_worker: 2}", kInterleaved, phases);
  // The phases name the algorithms (and the length) instead.
  yaml.replace(yaml.find("algorithm: "),
               std::string("algorithm: ").size() + strlen(kInterleaved) + 1, "");
  yaml.replace(yaml.find("steps: 2\n"), std::string("steps: 2\n").size(), "");
  auto spec = ParseJobSpec(yaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("stages.chunks_per_worker"));
  EXPECT_THAT(spec.status().message(), HasSubstr("phase 1 is not"));
}

}  // namespace
}  // namespace stagewise
