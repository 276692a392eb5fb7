// Job-spec errors that point (services/spec/errors.h): a table of broken job
// files, one row per kind of error, each with the line and column it must
// name; several errors in one file all reported; the bound; and --set
// assignments blamed as such.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

// A valid job, one key per line (line numbers below refer to it).
constexpr char kBase[] = R"(name: t
model:
  name: mlp
  hidden: [16]
data:
  dataset: synthetic
  shape: [1, 4, 4]
  classes: 4
optimizer:
  name: sgd
  lr: 0.05
batch_size: 32
steps: 5
stages: {count: 2}
)";

// kBase with line N replaced ("" deletes it) and lines appended.
std::string Edit(const std::map<int, std::string>& replace,
                 const std::vector<std::string>& append = {}) {
  std::vector<std::string> lines = absl::StrSplit(kBase, '\n');
  lines.pop_back();  // after the last newline
  for (const auto& [n, text] : replace) lines[n - 1] = text;
  lines.insert(lines.end(), append.begin(), append.end());
  std::string out;
  for (const std::string& l : lines) {
    if (!l.empty()) absl::StrAppend(&out, l, "\n");
  }
  return out;
}

struct Row {
  std::string kind;
  std::string yaml;
  std::string starts;  // the message's beginning: the key path
  std::string where;   // how it ends
};

class SpecErrorTable : public ::testing::TestWithParam<Row> {};

TEST(SpecErrorTable, TheBaseIsValid) { EXPECT_TRUE(ParseJobSpec(kBase).ok()); }

TEST_P(SpecErrorTable, NamesTheKeyAndWhereItIs) {
  const Row& row = GetParam();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(row.yaml);
  ASSERT_FALSE(spec.ok()) << row.yaml;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  EXPECT_THAT(message, ::testing::StartsWith(row.starts)) << row.yaml;
  EXPECT_THAT(message, ::testing::EndsWith(row.where)) << row.yaml;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one error, one line: " << message;
}

INSTANTIATE_TEST_SUITE_P(
    EveryKind, SpecErrorTable,
    ::testing::Values(
        Row{"yaml_syntax", Edit({{11, "  lr: [0.05"}}),
            "line 12, column 11: ", "end of sequence flow not found"},
        Row{"type", Edit({{12, "batch_size: abc"}}), "batch_size: expected an integer",
            "(line 12, column 13)"},
        Row{"unknown_top_level_key", Edit({}, {"colour: red"}), "colour: unknown key",
            "(line 15, column 1)"},
        Row{"unknown_nested_key", Edit({{11, "  lrr: 0.05"}}),
            "optimizer.lrr: unknown key (did you mean optimizer.lr?)", "(line 11, column 3)"},
        Row{"enum_value", Edit({{10, "  name: sgdd"}}), "optimizer.name: must be one of sgd, adam",
            "(line 10, column 3)"},
        Row{"algorithm_name", Edit({}, {"algorithm: petrra"}),
            "algorithm: unknown algorithm 'petrra' (did you mean petra?)", "(line 15, column 12)"},
        Row{"range", Edit({{11, "  lr: -1"}}), "optimizer.lr: must be >= 0, got -1",
            "(line 11, column 3)"},
        Row{"range_in_a_flow_map", Edit({{14, "stages: {count: 2, replicas: 0}"}}),
            "stages.replicas: must be in [1, 64], got 0", "(line 14, column 20)"},
        Row{"missing_required_key", Edit({{3, ""}}), "model.name: required", "(line 2, column 1)"},
        Row{"missing_dataset", Edit({{6, ""}}), "data.dataset: required", "(line 5, column 1)"},
        Row{"duplicate_key", Edit({}, {"steps: 6"}), "steps: duplicate key", "(line 15, column 1)"},
        Row{"rule_between_keys", Edit({}, {"checkpoint: {every_steps: 5}"}),
            "checkpoint.every_steps: requires checkpoint.dir", "(line 15, column 14)"},
        Row{"text_model_rule", Edit({{3, "  name: gpt"}, {4, ""}}),
            "model.depth: gpt: ", "(line 2, column 1)"},
        Row{"partition", Edit({{14, "stages: {count: 2, partition: [[0, 9]]}"}}),
            "stages.count: 2 does not match the 1 ranges", "(line 14, column 17)"},
        Row{"phase_entry",
            Edit({{13, ""}}, {"phases:", "  - {algorithm: backprop, steps: 2}",
                              "  - {algorithm: nosuch, steps: 3}"}),
            "phases[1].algorithm: unknown algorithm 'nosuch'", "(line 16, column 17)"}),
    [](const ::testing::TestParamInfo<Row>& info) { return info.param.kind; });

TEST(SpecErrors, SeveralErrorsAreAllReportedEachWithItsPlace) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(Edit({{10, "  name: sgdd"}, {12, "batch_size: abc"}}, {"colour: red"}));
  ASSERT_FALSE(spec.ok());
  const std::vector<std::string> lines = absl::StrSplit(spec.status().message(), '\n');
  ASSERT_EQ(lines.size(), 4u) << spec.status();
  EXPECT_EQ(lines[0], "3 errors in the job spec:");
  const std::string all(spec.status().message());
  EXPECT_THAT(all,
              ::testing::HasSubstr("optimizer.name: must be one of sgd, adam, muon; got 'sgdd' "
                                   "(did you mean sgd?) (line 10, column 3)"));
  EXPECT_THAT(
      all, ::testing::HasSubstr("batch_size: expected an integer, got 'abc' (line 12, column 13)"));
  EXPECT_THAT(all, ::testing::HasSubstr("colour: unknown key"));
  EXPECT_THAT(all, ::testing::HasSubstr("(line 15, column 1)"));
}

TEST(SpecErrors, AConsequenceOfAnErrorIsNotReportedAsAnother) {
  // The misspelt key is the error; the dataset it should have been is not a
  // second one.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(Edit({{6, "  datset: synthetic"}}));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(std::string(spec.status().message()),
            "data.datset: unknown key (did you mean data.dataset?) (line 6, column 3)");
}

TEST(SpecErrors, AtMostTwentyAreListed) {
  std::vector<std::string> extra;
  for (int i = 0; i < 30; ++i) extra.push_back(absl::StrCat("unknown_", i, ": 1"));
  absl::StatusOr<JobSpec> spec = ParseJobSpec(Edit({}, extra));
  ASSERT_FALSE(spec.ok());
  const std::vector<std::string> lines = absl::StrSplit(spec.status().message(), '\n');
  EXPECT_EQ(lines.front(), "20+ errors in the job spec:");
  EXPECT_EQ(lines.size(), 22u);  // the count, 20 errors, "and more"
  EXPECT_THAT(lines.back(), ::testing::HasSubstr("and more"));
}

TEST(SpecErrors, AnAssignmentsErrorIsBlamedOnTheAssignment) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kBase, {"optimizer.lr=-1"});
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(std::string(spec.status().message()),
            "optimizer.lr: must be >= 0, got -1 (--set optimizer.lr)");
  // A type error in an assigned value: its own text's marks are not the file's.
  spec = ParseJobSpec(kBase, {"batch_size=abc"});
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(std::string(spec.status().message()),
            "batch_size: expected an integer, got 'abc' (--set batch_size)");
  // The file's own error keeps the file's place, whatever is assigned.
  spec = ParseJobSpec(Edit({{12, "batch_size: abc"}}), {"steps=7", "model.hidden=[8]"});
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(std::string(spec.status().message()),
            "batch_size: expected an integer, got 'abc' (line 12, column 13)");
  // Both at once.
  spec = ParseJobSpec(Edit({{12, "batch_size: abc"}}), {"optimizer.name=sgdd"});
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              ::testing::HasSubstr("got 'sgdd' (did you mean sgd?) (--set optimizer.name)"));
  EXPECT_TRUE(ParseJobSpec(kBase, {"optimizer.lr=0.1"}).ok());
}

}  // namespace
}  // namespace stagewise
