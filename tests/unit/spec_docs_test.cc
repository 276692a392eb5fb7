// docs/job_spec.md's tables come from the spec library's field lists
// (services/spec/fields.h): each section of the page must hold exactly the
// table its list generates. To bring the page up to date after changing a
// field, run this test with STAGEWISE_WRITE_DOCS=1: it rewrites the tables in
// place (and still fails, so the change is seen).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/spec/fields.h"
#include "services/spec/job_spec.h"

namespace stagewise::spec {
namespace {

const std::string kDocPath = std::string(STAGEWISE_SOURCE_DIR) + "/docs/job_spec.md";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every (heading, generated table) pair the page must show.
std::vector<std::pair<std::string, std::string>> ExpectedTables() {
  return {
      {"## Top level", SectionTable(TopLevelFields())},
      {"## model", SectionTable(ModelFields())},
      {"## data", SectionTable(DataFields())},
      {"## algorithm", AlgorithmTable()},
      {"## optimizer", SectionTable(OptimizerFields())},
      {"## schedule", SectionTable(ScheduleFields())},
      {"## eval", SectionTable(EvalFields())},
      {"## checkpoint", SectionTable(CheckpointFields())},
      {"## recovery", SectionTable(RecoveryFields())},
      {"## sync", SectionTable(SyncFields())},
      {"## placement", SectionTable(PlacementFields())},
      {"## rebalance", SectionTable(RebalanceFields())},
      {"## transport", SectionTable(TransportFields())},
  };
}

// [begin, end) of the first table (a run of lines starting with '|') after
// `heading`, or npos if the heading or its table is missing.
std::pair<size_t, size_t> FindTable(const std::string& doc, const std::string& heading) {
  const size_t at = doc.find("\n" + heading + "\n");
  if (at == std::string::npos) return {std::string::npos, std::string::npos};
  const size_t next_heading = doc.find("\n## ", at + 1);
  size_t begin = doc.find("\n|", at);
  if (begin == std::string::npos || begin > next_heading) {
    return {std::string::npos, std::string::npos};
  }
  ++begin;
  size_t end = begin;
  while (end < doc.size() && doc[end] == '|') {
    const size_t eol = doc.find('\n', end);
    end = eol == std::string::npos ? doc.size() : eol + 1;
  }
  return {begin, end};
}

TEST(SpecDocs, EveryTableIsGeneratedFromTheFieldLists) {
  std::string doc = ReadFile(kDocPath);
  ASSERT_FALSE(doc.empty()) << kDocPath;
  bool changed = false;
  for (const auto& [heading, table] : ExpectedTables()) {
    const auto [begin, end] = FindTable(doc, heading);
    ASSERT_NE(begin, std::string::npos) << kDocPath << ": no table under '" << heading << "'";
    const std::string shown = doc.substr(begin, end - begin);
    EXPECT_EQ(shown, table) << kDocPath << ", section '" << heading
                            << "': the table differs from the field list (services/spec/"
                               "fields.cc); run with STAGEWISE_WRITE_DOCS=1 to rewrite it";
    if (shown != table) {
      doc.replace(begin, end - begin, table);
      changed = true;
    }
  }
  const char* write = std::getenv("STAGEWISE_WRITE_DOCS");
  if (changed && write != nullptr && std::string(write) == "1") {
    std::ofstream(kDocPath) << doc;
    ADD_FAILURE() << "rewrote the tables of " << kDocPath;
  }
}

// The parser takes its key names from the same lists: a key in the docs table
// is accepted, and a misspelt one is refused with the closest as suggestion.
TEST(SpecDocs, EveryDocumentedOptimizerKeyParsesAndTyposAreSuggested) {
  for (const Field<OptimizerSpec>& f : OptimizerFields()) {
    const std::string base = "name: t\nmodel: {name: mlp}\ndata: {dataset: synthetic}\nepochs: 1\n";
    // A typo: the key with its last letter doubled.
    const std::string typo = f.key + f.key.back();
    absl::StatusOr<JobSpec> spec = ParseJobSpec(base + "optimizer: {" + typo + ": 1}\n");
    ASSERT_FALSE(spec.ok()) << typo;
    EXPECT_THAT(std::string(spec.status().message()),
                ::testing::HasSubstr("did you mean optimizer." + f.key + "?"))
        << typo;
  }
}

TEST(SpecDocs, EnumSpellingsRoundTrip) {
  for (AlgorithmKind k :
       {AlgorithmKind::kBackprop, AlgorithmKind::kDelayed, AlgorithmKind::kFeaturesReplay,
        AlgorithmKind::kPetra, AlgorithmKind::kNwise, AlgorithmKind::kAuxNet}) {
    EXPECT_EQ(EnumFromName<AlgorithmKind>(NameOf(k)), k);
  }
  EXPECT_EQ(EnumFromName<Compression>("fp8"), std::nullopt);
  EXPECT_EQ(NameOf(PipelineSchedule::kOneFOneB), "1f1b");
  EXPECT_EQ(EnumNames<BlockModes>(), (std::vector<std::string>{"auto", "store", "rebuild"}));
  // The schema table follows AlgorithmKind order.
  for (size_t i = 0; i < AlgorithmSchemas().size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(AlgorithmSchemas()[i].kind), i);
    EXPECT_EQ(AlgorithmSchemas()[i].defaults.index(), i);
  }
}

// A Range is both the docs' "allowed" text and the check: each kind of bound
// shown and enforced the same way, NaN in no range.
TEST(SpecRanges, TextAndCheckComeFromOneRange) {
  EXPECT_EQ(AtLeast(1).Text(), ">= 1");
  EXPECT_EQ(Above(0).Text(), "> 0");
  EXPECT_EQ(Between(0, 1, false, true).Text(), "[0, 1)");
  EXPECT_EQ(Between(0, 1000, true, false).Text(), "(0, 1000]");
  EXPECT_EQ(Between(0, 1e12).Text(), "[0, 1000000000000]");
  EXPECT_TRUE(Between(0, 1, false, true).Contains(0));
  EXPECT_FALSE(Between(0, 1, false, true).Contains(1));
  EXPECT_FALSE(Above(0).Contains(0));
  EXPECT_FALSE(AtLeast(0).Contains(std::nan("")));
  EXPECT_EQ(AtLeast(1).Check("batch_size", 0).message(), "batch_size: must be >= 1, got 0");
  EXPECT_EQ(Between(0, 1, false, true).Check("optimizer.beta2", 1.5).message(),
            "optimizer.beta2: must be in [0, 1), got 1.5");
  EXPECT_TRUE(Above(0).Check("x", 1e-9).ok());
}

// Every ranged key of every plain section: its docs cell starts with its
// range, and a spec with the value just outside it is refused naming
// <section>.<key> and the range.
TEST(SpecRanges, EveryRangedKeyRefusesAValueOutsideItsRange) {
  int ranged = 0;
  auto check_section = [&](const auto& fields) {
    for (const auto& f : fields) {
      if (!f.check) continue;
      ++ranged;
      EXPECT_EQ(f.allowed.find("`"), f.allowed.find("each ") == 0 ? 5u : 0u) << f.key;
    }
  };
  check_section(TopLevelFields());
  check_section(ModelFields());
  check_section(DataFields());
  check_section(OptimizerFields());
  check_section(ScheduleFields());
  check_section(EvalFields());
  check_section(CheckpointFields());
  check_section(RecoveryFields());
  check_section(SyncFields());
  check_section(PlacementFields());
  check_section(RebalanceFields());
  EXPECT_GE(ranged, 35);
  // Through the parser, a key of each kind of range and section.
  const std::string base = "name: t\ndata: {dataset: synthetic}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"epochs: 1\nbatch_size: 0\n", "batch_size: must be >= 1, got 0"},
      {"steps: 2000000000000\n", "steps: must be in [0, 1000000000000], got 2000000000000"},
      {"epochs: 1\noptimizer: {beta2: 1}\n", "optimizer.beta2: must be in [0, 1), got 1"},
      {"epochs: 1\nsync: {lr: 0}\n", "sync.lr: must be in (0, 1000], got 0"},
      {"epochs: 1\nrebalance: {max_per_hour: 4000}\n",
       "rebalance.max_per_hour: must be in (0, 3600], got 4000"},
      {"epochs: 1\nplacement: {link_gbps: -1}\n", "placement.link_gbps: must be in [0, "},
      {"epochs: 1\nmodel: {name: mlp, hidden: [4, 0]}\n", "model.hidden[1]: must be >= 1, got 0"},
      {"epochs: 1\nrecovery: {wait_seconds: 0}\n", "recovery.wait_seconds: must be > 0, got 0"},
      {"epochs: 1\neval: {every_steps: -2}\n", "eval.every_steps: must be >= 0, got -2"},
  };
  for (const auto& [extra, expected] : cases) {
    const std::string text =
        base + (extra.find("model:") == std::string::npos ? "model: {name: mlp}\n" : "") + extra;
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_NE(std::string(spec.status().message()).find(expected), std::string::npos)
        << spec.status() << "\n--- expected: " << expected;
  }
}

}  // namespace
}  // namespace stagewise::spec
