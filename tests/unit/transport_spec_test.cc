// transport (docs/job_spec.md): the wire format per direction, block-wise
// integer formats and error feedback, refused naming the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

using ::testing::StartsWith;

std::string Yaml(const std::string& transport) {
  return absl::StrCat(
      "name: t\nmodel: {name: mlp, hidden: [8]}\n"
      "data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [1, 4, 4]}\n"
      "stages: 2\nbatch_size: 16\nsteps: 2\n",
      transport.empty() ? "" : absl::StrCat("transport: ", transport, "\n"));
}

std::string Error(const std::string& transport) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(Yaml(transport));
  return spec.ok() ? "parsed" : std::string(spec.status().message());
}

TEST(TransportSpec, TopLevelKeysApplyToBothDirectionsAndEachMayOverride) {
  auto plain = ParseJobSpec(Yaml(""));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->transport.forward.compression, Compression::kNone);
  EXPECT_EQ(plain->transport.backward.compression, Compression::kNone);
  EXPECT_EQ(plain->transport.forward.block, 64);
  EXPECT_FALSE(plain->transport.error_feedback);

  auto both = ParseJobSpec(Yaml("{compression: int8, block: 128, rotate: true}"));
  ASSERT_TRUE(both.ok()) << both.status();
  for (const WireFormatSpec* f : {&both->transport.forward, &both->transport.backward}) {
    EXPECT_EQ(f->compression, Compression::kInt8);
    EXPECT_EQ(f->block, 128);
    EXPECT_TRUE(f->rotate);
  }

  auto split =
      ParseJobSpec(Yaml("{compression: int8, error_feedback: true, forward: {compression: bf16}, "
                        "backward: {compression: int4, block: 32}}"));
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->transport.forward.compression, Compression::kBf16);
  EXPECT_EQ(split->transport.forward.block, 64);
  EXPECT_EQ(split->transport.backward.compression, Compression::kInt4);
  EXPECT_EQ(split->transport.backward.block, 32);
  EXPECT_TRUE(split->transport.error_feedback);

  // Only one direction compressed.
  auto forward_only = ParseJobSpec(Yaml("{forward: {compression: int4, rotate: true}}"));
  ASSERT_TRUE(forward_only.ok()) << forward_only.status();
  EXPECT_EQ(forward_only->transport.forward.compression, Compression::kInt4);
  EXPECT_TRUE(forward_only->transport.forward.rotate);
  EXPECT_EQ(forward_only->transport.backward.compression, Compression::kNone);
}

TEST(TransportSpec, BadValuesNameTheirKey) {
  EXPECT_THAT(Error("{compression: int2}"),
              StartsWith("transport.compression: must be one of none, fp16, bf16, int8, int4, "
                         "auto; got 'int2'"));
  EXPECT_THAT(Error("{backward: {compression: fp8}}"),
              StartsWith("transport.backward.compression: must be one of none, fp16, bf16, "
                         "int8, int4, auto; got 'fp8'"));
  EXPECT_THAT(Error("{compression: int8, block: 8}"),
              StartsWith("transport.block: must be in [16, 4096], got 8"));
  EXPECT_THAT(Error("{compression: int8, block: 96}"),
              StartsWith("transport.block: must be a power of two (16, 32, ..., 4096), got 96"));
  EXPECT_THAT(Error("{compression: int8, forward: {block: 8192}}"),
              StartsWith("transport.forward.block: must be in [16, 4096], got 8192"));
  EXPECT_THAT(Error("{compression: int8, backward: {block: 100}}"),
              StartsWith("transport.backward.block: must be a power of two"));
  EXPECT_THAT(Error("{forward: {compresion: int8}}"),
              StartsWith("transport.forward.compresion: unknown key (did you mean "
                         "transport.forward.compression?)"));
  EXPECT_THAT(Error("{compression: bf16, rotate: true}"),
              StartsWith("transport.rotate: rotates blocks of int8 or int4 values, and neither "
                         "direction uses them"));
  EXPECT_THAT(Error("{error_feedback: true}"),
              StartsWith("transport.error_feedback: needs a lossy format for gradients"));
  EXPECT_THAT(Error("{compression: int8, backward: {compression: none}, error_feedback: true}"),
              StartsWith("transport.error_feedback: needs a lossy format for gradients"));
  EXPECT_THAT(Error("{forward: int8}"), StartsWith("transport.forward"));
  // auto needs the links' speed, named where it was written.
  EXPECT_THAT(Error("{compression: auto}"),
              StartsWith("transport.compression: auto picks a format for the links' speed: set "
                         "placement.link_gbps"));
  EXPECT_THAT(Error("{backward: {compression: auto}}"),
              StartsWith("transport.backward.compression: auto picks a format"));
}

// compression: auto is left to the planner (planner::ChooseWire); with it,
// rotate and error_feedback are accepted (auto may pick int8/int4).
TEST(TransportSpec, AutoWithALinkSpeedParses) {
  auto spec = ParseJobSpec(Yaml("{compression: auto, rotate: true, error_feedback: true}") +
                           "placement: {link_gbps: 0.2}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->transport.forward.compression, Compression::kAuto);
  EXPECT_EQ(spec->transport.backward.compression, Compression::kAuto);
  auto forward =
      ParseJobSpec(Yaml("{forward: {compression: auto}, backward: {compression: bf16}}") +
                   "placement: {link_gbps: 1}\n");
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_EQ(forward->transport.forward.compression, Compression::kAuto);
  EXPECT_EQ(forward->transport.backward.compression, Compression::kBf16);
}

}  // namespace
}  // namespace stagewise
