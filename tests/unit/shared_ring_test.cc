#include "services/tensor/shared_ring.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "services/tensor/codec.h"
#include "services/tensor/stage_message.h"

namespace stagewise {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/shared_ring_test_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  EXPECT_NE(dir, nullptr);
  return dir == nullptr ? "/tmp" : dir;
}

class SharedRingTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }
  const std::string dir_ = TempDir();
};

TEST_F(SharedRingTest, APayloadGoesAcrossOnceAndItsRegionIsReused) {
  auto ring = SharedRing::Create(dir_, 1 << 16);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  // The reader unlinked the file: nothing is left behind if either side dies.
  EXPECT_TRUE(std::filesystem::is_empty(dir_));

  for (int round = 0; round < 50; ++round) {  // many times the ring's size
    auto region = (*ring)->Allocate(10000);
    ASSERT_TRUE(region.has_value()) << round;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(region->data) % SharedRing::kAlign, 0u);
    std::memset(region->data, 'a' + round % 26, region->length);
    std::string out;
    ASSERT_TRUE((*view)->Take(region->offset, region->length, &out).ok());
    EXPECT_EQ(out, std::string(10000, static_cast<char>('a' + round % 26)));
    // Taken twice: refused.
    absl::Status again = (*view)->Take(region->offset, region->length, &out);
    EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ((*ring)->used(), 0u);
}

TEST_F(SharedRingTest, AFullRingSaysSoUntilTheOldestIsTakenAndWrapsAround) {
  auto ring = SharedRing::Create(dir_, 4096);  // 4096 bytes: three 1000-byte regions fit
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  std::vector<SharedRing::Region> held;
  while (auto r = (*ring)->Allocate(1000)) held.push_back(*r);
  ASSERT_EQ(held.size(), 3u);
  EXPECT_FALSE((*ring)->Allocate(1000).has_value());
  std::string out;
  // Freed out of order: the middle one does not make room before the oldest.
  ASSERT_TRUE((*view)->Take(held[1].offset, held[1].length, &out).ok());
  EXPECT_FALSE((*ring)->Allocate(1000).has_value());
  ASSERT_TRUE((*view)->Take(held[0].offset, held[0].length, &out).ok());
  auto wrapped = (*ring)->Allocate(1500);  // does not fit at the end: from the start
  ASSERT_TRUE(wrapped.has_value());
  EXPECT_EQ(wrapped->offset, 0u);
  EXPECT_FALSE((*ring)->Allocate(2000).has_value());     // larger than the ring has free
  EXPECT_FALSE((*ring)->Allocate(1 << 20).has_value());  // larger than the ring
}

TEST_F(SharedRingTest, DescriptorsOutsideTheRingOrOfTheWrongLengthAreRefused) {
  auto ring = SharedRing::Create(dir_, 8192);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  auto region = (*ring)->Allocate(100);
  ASSERT_TRUE(region.has_value());
  std::string out;
  EXPECT_FALSE((*view)->Take(region->offset, 101, &out).ok());       // wrong length
  EXPECT_FALSE((*view)->Take(region->offset + 64, 100, &out).ok());  // not a region
  EXPECT_FALSE((*view)->Take(region->offset + 1, 100, &out).ok());   // misaligned
  EXPECT_FALSE((*view)->Take(8192, 100, &out).ok());                 // past the end
  EXPECT_FALSE((*view)->Take(0, ~uint64_t{0}, &out).ok());           // overflowing
  EXPECT_TRUE((*view)->Take(region->offset, 100, &out).ok());
}

TEST_F(SharedRingTest, OnlyTheAnnouncedRingWithItsTokenOpens) {
  auto ring = SharedRing::Create(dir_, 8192);
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::string token = (*ring)->token();
  token[0] ^= 1;
  EXPECT_FALSE(SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), token).ok());
  EXPECT_FALSE(
      SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size() * 2, (*ring)->token()).ok());
  EXPECT_FALSE(SharedRingView::Open(dir_, "../etc/passwd", 8192, (*ring)->token()).ok());
  EXPECT_EQ(
      SharedRingView::Open(dir_, "stagewise-ring-nothere", 8192, (*ring)->token()).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_FALSE(SharedRing::Create(dir_ + "/missing", 8192).ok());
}

TEST_F(SharedRingTest, ATensorThroughTheRingDecodesAsTheInlineOne) {
  auto ring = SharedRing::Create(dir_, 1 << 20);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  torch::manual_seed(3);
  // Non-contiguous on purpose: the ring path copies through from_blob.
  const torch::Tensor x = torch::randn({512, 256}).t();
  for (v1::Compression compression :
       {v1::COMPRESSION_NONE, v1::COMPRESSION_BF16, v1::COMPRESSION_FP16}) {
    SCOPED_TRACE(v1::Compression_Name(compression));
    EncodeOptions inline_options;
    inline_options.compression = compression;
    EncodeOptions ring_options = inline_options;
    ring_options.ring = ring->get();
    v1::StageMessage inline_message, ring_message;
    ASSERT_TRUE(EncodeTensor(x, &(*inline_message.mutable_tensors())["x"], inline_options).ok());
    const int64_t before = SharedRing::TotalPayloads();
    ASSERT_TRUE(EncodeTensor(x, &(*ring_message.mutable_tensors())["x"], ring_options).ok());
    EXPECT_EQ(SharedRing::TotalPayloads(), before + 1);
    ASSERT_TRUE(ring_message.tensors().at("x").has_shared());
    EXPECT_TRUE(ring_message.tensors().at("x").data().empty());
    // Unresolved, it fails every check; without a ring it cannot be resolved.
    EXPECT_FALSE(ValidateTensorProto(ring_message.tensors().at("x")).ok());
    v1::StageMessage copy = ring_message;
    absl::Status no_ring = ResolveSharedPayloads(&copy, nullptr);
    EXPECT_NE(no_ring.message().find("tensors['x']"), std::string::npos) << no_ring;
    // A limit below the payload refuses it before any copy.
    EXPECT_FALSE(ResolveSharedPayloads(&copy, view->get(), 16).ok());
    ASSERT_TRUE(ResolveSharedPayloads(&ring_message, view->get()).ok());
    EXPECT_EQ(ring_message.tensors().at("x").data(), inline_message.tensors().at("x").data());
    auto decoded = DecodeTensor(ring_message.tensors().at("x"));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    auto expected = DecodeTensor(inline_message.tensors().at("x"));
    ASSERT_TRUE(expected.ok());
    EXPECT_TRUE(torch::equal(*decoded, *expected));
  }
  // Small tensors stay inline.
  v1::TensorProto small;
  EncodeOptions ring_options;
  ring_options.ring = ring->get();
  ASSERT_TRUE(EncodeTensor(torch::ones({4}), &small, ring_options).ok());
  EXPECT_FALSE(small.has_shared());
  EXPECT_EQ(small.data().size(), 16u);
}

TEST_F(SharedRingTest, ANarrowedPayloadComesOutWidenedForAReceiverOnTheCpu) {
  auto ring = SharedRing::Create(dir_, 4 << 20);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({256, 384}) * 1000;  // 192 KiB narrowed
  for (v1::Compression compression : {v1::COMPRESSION_BF16, v1::COMPRESSION_FP16}) {
    SCOPED_TRACE(v1::Compression_Name(compression));
    EncodeOptions options;
    options.compression = compression;
    v1::TensorProto inline_proto;
    ASSERT_TRUE(EncodeTensor(x, &inline_proto, options).ok());
    auto expected = DecodeTensor(inline_proto);
    ASSERT_TRUE(expected.ok()) << expected.status();
    options.ring = ring->get();
    const uint64_t used = (*ring)->used();
    v1::StageMessage widened, narrow;
    ASSERT_TRUE(EncodeTensor(x, &(*widened.mutable_tensors())["x"], options).ok());
    ASSERT_TRUE(EncodeTensor(x, &(*narrow.mutable_tensors())["x"], options).ok());
    EXPECT_EQ(widened.tensors().at("x").shared().length(), x.numel() * 2u);
    ASSERT_TRUE(ResolveSharedPayloads(&widened, view->get(), kDefaultMaxTensorBytes, true).ok());
    // A widened size over the limit stays narrow (and is still taken).
    ASSERT_TRUE(ResolveSharedPayloads(&narrow, view->get(), x.numel() * 3, true).ok());
    EXPECT_EQ((*ring)->used(), used);
    const v1::TensorProto& w = widened.tensors().at("x");
    EXPECT_EQ(w.compression(), v1::COMPRESSION_NONE);
    EXPECT_EQ(w.data().size(), x.numel() * 4u);
    EXPECT_TRUE(ValidateTensorProto(w).ok());
    EXPECT_EQ(narrow.tensors().at("x").compression(), compression);
    EXPECT_EQ(narrow.tensors().at("x").data(), inline_proto.data());
    for (const v1::StageMessage* m : {&widened, &narrow}) {
      auto decoded = DecodeTensor(m->tensors().at("x"));
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(decoded->scalar_type(), torch::kFloat);
      EXPECT_TRUE(torch::equal(*decoded, *expected));
    }
  }
}

TEST_F(SharedRingTest, APayloadNarrowedForAFullRingGoesInlineAsBefore) {
  auto ring = SharedRing::Create(dir_, 8192);
  ASSERT_TRUE(ring.ok()) << ring.status();
  const torch::Tensor x = torch::randn({256, 256});  // 128 KiB narrowed: does not fit
  EncodeOptions options;
  options.compression = v1::COMPRESSION_BF16;
  v1::TensorProto inline_proto, full;
  ASSERT_TRUE(EncodeTensor(x, &inline_proto, options).ok());
  options.ring = ring->get();
  const int64_t full_before = SharedRing::TotalFull();
  ASSERT_TRUE(EncodeTensor(x, &full, options).ok());
  EXPECT_EQ(SharedRing::TotalFull(), full_before + 1);
  EXPECT_FALSE(full.has_shared());
  EXPECT_EQ(full.compression(), v1::COMPRESSION_BF16);
  EXPECT_EQ(full.data(), inline_proto.data());
}

}  // namespace
}  // namespace stagewise
