// docs/job_spec.md's tables come from the spec library's field lists
// (services/spec/fields.h): each section of the page must hold exactly the
// table its list generates. To bring the page up to date after changing a
// field, run this test with STAGEWISE_WRITE_DOCS=1: it rewrites the tables in
// place (and still fails, so the change is seen).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "services/spec/fields.h"

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

}  // namespace
}  // namespace stagewise::spec
