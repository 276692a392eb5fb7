// The text keys of a job spec (docs/text.md): defaults, shapes filled from
// the data, and errors that name the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Yaml(const std::string& model, const std::string& data,
                 const std::string& algorithm = "petra") {
  return absl::StrCat("name: text\nmodel: ", model, "\ndata: ", data, "\nalgorithm: ", algorithm,
                      "\nstages: 2\nbatch_size: 8\nsteps: 2\n");
}

TEST(TextSpec, ShapesComeFromTheSequenceLength) {
  auto spec = ParseJobSpec(Yaml("{name: reformer, depth: 2, width: 32, heads: 4}",
                                "{dataset: fortunes, sequence_length: 64}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.input_shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(spec->model.num_classes, 256);
  EXPECT_EQ(spec->data.eval_split, TextSplit::kValidation);
  EXPECT_EQ(spec->data.train_size, 4096);  // sequences per epoch
  EXPECT_TRUE(IsText(spec->data.dataset));
}

struct Bad {
  std::string what, model, data, algorithm, key, also;
};

void PrintTo(const Bad& c, std::ostream* os) { *os << c.what; }

class TextSpecErrors : public ::testing::TestWithParam<Bad> {};

TEST_P(TextSpecErrors, NameTheKey) {
  const Bad& c = GetParam();
  auto spec = ParseJobSpec(Yaml(c.model, c.data, c.algorithm.empty() ? "petra" : c.algorithm));
  ASSERT_FALSE(spec.ok()) << c.what;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(c.key + ": ")) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.also)) << spec.status();
}

INSTANTIATE_TEST_SUITE_P(
    All, TextSpecErrors,
    ::testing::Values(
        Bad{"heads", "{name: gpt, depth: 2, width: 30, heads: 4}", "{dataset: fortunes}", "",
            "model.heads", "do not divide model.width 30"},
        Bad{"depth", "{name: gpt, width: 32}", "{dataset: fortunes}", "", "model.depth", "[1, "},
        Bad{"image data", "{name: gpt, depth: 2}", "{dataset: fashion_mnist}", "", "data.dataset",
            "byte-level language model"},
        Bad{"image model", "{name: revnet, depth: 18}", "{dataset: fortunes}", "", "model.name",
            "is text"},
        Bad{"long sequence", "{name: gpt, depth: 2}", "{dataset: fortunes, sequence_length: 5000}",
            "", "data.sequence_length", "[2, 4096]"},
        Bad{"min length", "{name: gpt, depth: 2}",
            "{dataset: fortunes, sequence_length: 16, min_sequence_length: 17}", "",
            "data.min_sequence_length", "16"},
        Bad{"text file path", "{name: gpt, depth: 2}", "{dataset: text_file}", "", "data.path",
            "UTF-8"},
        Bad{"split", "{name: gpt, depth: 2}", "{dataset: fortunes, eval_split: train}", "",
            "data.eval_split", "validation"},
        Bad{"nwise conv head", "{name: gpt, depth: 2}", "{dataset: fortunes}",
            "{name: nwise, n: 2}", "algorithm.aux_head", "takes `linear`"},
        Bad{"auxnet", "{name: gpt, depth: 2}", "{dataset: fortunes}", "auxnet", "algorithm",
            "does not carry over"}),
    [](const ::testing::TestParamInfo<Bad>& info) {
      std::string name;
      for (char c : info.param.what) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

}  // namespace
}  // namespace stagewise
