#include "services/tensor/shared_ring.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "services/tensor/codec.h"
#include "services/tensor/ring_leases.h"
#include "services/tensor/stage_message.h"
#include "services/tensor/stream_copy.h"

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

TEST_F(SharedRingTest, AFullRingSaysSoUntilARegionIsTakenWhichIsReusedWhereItLies) {
  auto ring = SharedRing::Create(dir_, 4096);  // 4096 bytes: three 1000-byte regions fit
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  std::vector<SharedRing::Region> held;
  while (auto r = (*ring)->Allocate(1000)) held.push_back(*r);
  ASSERT_EQ(held.size(), 3u);
  EXPECT_FALSE((*ring)->Allocate(1000).has_value());
  std::string out;
  // Freed out of order: the middle one makes room where it was, no more.
  ASSERT_TRUE((*view)->Take(held[1].offset, held[1].length, &out).ok());
  EXPECT_FALSE((*ring)->Allocate(1500).has_value());
  auto middle = (*ring)->Allocate(1000);
  ASSERT_TRUE(middle.has_value());
  EXPECT_EQ(middle->offset, held[1].offset);
  // Two neighbouring free regions join: room for a larger one at the start.
  ASSERT_TRUE((*view)->Take(held[0].offset, held[0].length, &out).ok());
  ASSERT_TRUE((*view)->Take(middle->offset, middle->length, &out).ok());
  auto joined = (*ring)->Allocate(2000);
  ASSERT_TRUE(joined.has_value());
  EXPECT_EQ(joined->offset, 0u);
  EXPECT_FALSE((*ring)->Allocate(2000).has_value());     // larger than the ring has free
  EXPECT_FALSE((*ring)->Allocate(1 << 20).has_value());  // larger than the ring
}

TEST_F(SharedRingTest, APlacedRegionGoesAsItIsAndComesBackOnlyWhenBothSidesAreDone) {
  auto created = SharedRing::Create(dir_, 1 << 16);
  ASSERT_TRUE(created.ok()) << created.status();
  std::shared_ptr<SharedRing> ring = std::move(*created);  // placement keeps it alive
  auto view = SharedRingView::Open(dir_, ring->name(), ring->size(), ring->token());
  ASSERT_TRUE(view.ok()) << view.status();
  const int64_t in_place = SharedRing::TotalPublishedInPlace();

  void* placed = ring->Place(1000);
  ASSERT_NE(placed, nullptr);
  EXPECT_TRUE(ring->Contains(placed));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(placed) % SharedRing::kAlign, 0u);
  std::memset(placed, 7, 1000);
  EXPECT_FALSE(ring->Publish(placed, 999).has_value());  // not the placed length
  const std::optional<uint64_t> offset = ring->Publish(placed, 1000);
  ASSERT_TRUE(offset.has_value());
  EXPECT_FALSE(ring->Publish(placed, 1000).has_value());  // once
  EXPECT_EQ(SharedRing::TotalPublishedInPlace(), in_place + 1);
  std::string out;
  ASSERT_TRUE((*view)->Take(*offset, 1000, &out).ok());
  EXPECT_EQ(out, std::string(1000, '\7'));
  EXPECT_GT(ring->used(), 0u);  // the writer's tensor still reads it
  ring->Unplace(placed);
  EXPECT_EQ(ring->used(), 0u);

  // Placed, never published: the writer's free is enough, and the reader
  // cannot take it.
  void* unsent = ring->Place(1000);
  ASSERT_NE(unsent, nullptr);
  const uint64_t unsent_offset =
      static_cast<uint64_t>(static_cast<uint8_t*>(unsent) - static_cast<uint8_t*>(placed)) +
      *offset;
  EXPECT_FALSE((*view)->Take(unsent_offset, 1000, &out).ok());
  ring->Unplace(unsent);
  EXPECT_EQ(ring->used(), 0u);

  // Published, the reader is the last: the region comes back after it.
  void* second = ring->Place(1000);
  ASSERT_NE(second, nullptr);
  const std::optional<uint64_t> second_offset = ring->Publish(second, 1000);
  ASSERT_TRUE(second_offset.has_value());
  ring->Unplace(second);
  EXPECT_GT(ring->used(), 0u);
  ASSERT_TRUE((*view)->Take(*second_offset, 1000, &out).ok());
  EXPECT_EQ(ring->used(), 0u);

  // A region allocated for a copy is not placed; placing stops at half the
  // ring in use, copies included.
  auto region = ring->Allocate(1000);
  ASSERT_TRUE(region.has_value());
  EXPECT_FALSE(ring->Publish(region->data, 1000).has_value());
  EXPECT_EQ(ring->Place(ring->size() / 2), nullptr);
  void* most = ring->Place(ring->size() / 2 - 2048);
  ASSERT_NE(most, nullptr);
  EXPECT_EQ(ring->Place(1000), nullptr);
  EXPECT_TRUE(ring->Allocate(1000).has_value());  // copies still find room
  void* for_send = ring->PlaceForSend(1000);      // and so does a tensor made to be sent
  ASSERT_NE(for_send, nullptr);
  EXPECT_TRUE(ring->Publish(for_send, 1000).has_value());
  ring->Unplace(for_send);
  ring->Unplace(most);
}

TEST_F(SharedRingTest, PlacedMemoryKeepsItsRingAliveAndAnUnsharedRingPlacesNothing) {
  auto unshared = SharedRing::Create(dir_, 1 << 16);
  ASSERT_TRUE(unshared.ok()) << unshared.status();
  EXPECT_EQ((*unshared)->Place(1000), nullptr);  // a unique_ptr cannot keep itself alive

  auto created = SharedRing::Create(dir_, 1 << 16);
  ASSERT_TRUE(created.ok()) << created.status();
  std::shared_ptr<SharedRing> ring = std::move(*created);
  std::weak_ptr<SharedRing> alive = ring;
  SharedRing* raw = ring.get();
  void* placed = raw->Place(4096);
  ASSERT_NE(placed, nullptr);
  ring.reset();
  EXPECT_FALSE(alive.expired());
  std::memset(placed, 1, 4096);  // still mapped
  raw->Unplace(placed);
  EXPECT_TRUE(alive.expired());
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

TEST(CopyToRing, CopiesEveryByteWhateverTheSizeAndAlignment) {
  std::vector<uint8_t> src((4 << 20) + 300);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  std::vector<uint8_t> dst(src.size() + 64);
  // 64-byte aligned (a ring region), and off by one and by 16 bytes; the
  // source 3 bytes off.
  uint8_t* aligned = dst.data() + (64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64;
  const uint8_t* from = src.data() + 3;
  for (size_t offset : {size_t{0}, size_t{1}, size_t{16}}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{127}, size_t{256} << 10,
                         (size_t{256} << 10) + 77, size_t{4} << 20, (size_t{4} << 20) + 200}) {
      SCOPED_TRACE(testing::Message() << bytes << " bytes at offset " << offset);
      std::fill(dst.begin(), dst.end(), 0xAB);
      CopyToRing(aligned + offset, from, bytes);
      EXPECT_EQ(std::memcmp(aligned + offset, from, bytes), 0);
      EXPECT_EQ(aligned[offset + bytes], 0xAB) << "wrote past the end";
    }
  }
}

// Every bit pattern class (NaNs of both signs, infinities, ties, denormals)
// rounds as LibTorch's float -> bfloat16 -> float does, on the streamed path
// (large, aligned) and the plain one; NaNs become the quiet NaN.
TEST(CopyToRing, RoundsToBfloat16AsLibTorchDoes) {
  const int64_t n = (300 << 10) / 4 + 5;
  std::vector<uint32_t> bits(n);
  uint64_t state = 88172645463325252ull;
  for (int64_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    bits[i] = static_cast<uint32_t>(state);
  }
  const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffffffffu, 0x7f800001u,
                              0x3f808000u, 0x3f818000u, 0x00000001u, 0x7f7fffffu, 0x80000000u};
  std::copy(std::begin(special), std::end(special), bits.begin());
  torch::Tensor values =
      torch::from_blob(bits.data(), {n}, torch::kInt32).view(torch::kFloat).clone();
  torch::Tensor want = values.to(torch::kBFloat16).to(torch::kFloat);
  auto* want_bits = static_cast<const uint32_t*>(want.data_ptr());
  std::vector<uint32_t> out(n + 16);
  uint32_t* aligned = out.data() + (32 - reinterpret_cast<uintptr_t>(out.data()) % 32) % 32 / 4;
  for (int64_t count : {int64_t{1}, int64_t{1000}, n}) {
    for (uint32_t* dst : {aligned, aligned + 1}) {
      RoundBf16ToRing(dst, bits.data(), count);
      for (int64_t i = 0; i < count; ++i) {
        const bool nan = (bits[i] & 0x7fffffffu) > 0x7f800000u;
        ASSERT_EQ(dst[i], nan ? 0x7fc00000u : want_bits[i])
            << "value " << i << " of " << count << ", bits " << bits[i];
      }
    }
  }
}

// A ring payload encoded from `x` into message `seq`.
v1::StageMessage RingMessage(SharedRing* ring, const torch::Tensor& x, int64_t seq,
                             v1::Compression compression = v1::COMPRESSION_NONE) {
  EncodeOptions options;
  options.ring = ring;
  options.compression = compression;
  options.min_shared_bytes = 1;
  v1::StageMessage m;
  m.set_seq(seq);
  EXPECT_TRUE(EncodeTensor(x, &(*m.mutable_tensors())["x"], options).ok());
  EXPECT_TRUE(m.tensors().at("x").has_shared());
  return m;
}

ResolveOptions Lending(const void* owner) {
  ResolveOptions options;
  options.lend_owner = owner;
  options.lend_min_bytes = 1;
  return options;
}

TEST_F(SharedRingTest, AFloatPayloadIsReadInPlaceUntilItsTensorIsFreed) {
  auto ring = SharedRing::Create(dir_, 1 << 20);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  const int owner = 0;
  const torch::Tensor x = torch::randn({128, 256});  // 128 KiB, an eighth of the ring
  v1::StageMessage m = RingMessage(ring->get(), x, 1);
  const int64_t outstanding = RingLeases::Outstanding();
  ASSERT_TRUE(ResolveSharedPayloads(&m, view->get(), Lending(&owner)).ok());
  v1::TensorProto& proto = (*m.mutable_tensors())["x"];
  ASSERT_TRUE(proto.has_shared());
  EXPECT_NE(proto.shared().lease(), 0u);
  EXPECT_TRUE(proto.data().empty());
  EXPECT_TRUE(ValidateTensorProto(proto).ok());
  EXPECT_EQ(LentBytes(m), 128 * 256 * 4);
  EXPECT_EQ(RingLeases::Outstanding(), outstanding + 1);
  EXPECT_EQ((*view)->held_bytes(), 128u * 256 * 4);

  // A copy of the proto reads the same bytes and leaves the lease in place.
  v1::TensorProto copy = proto;
  ASSERT_TRUE(InlineLentPayload(&copy).ok());
  EXPECT_FALSE(copy.has_shared());
  auto from_copy = DecodeTensor(copy);
  ASSERT_TRUE(from_copy.ok()) << from_copy.status();
  EXPECT_TRUE(torch::equal(*from_copy, x));
  auto const_decoded = DecodeTensor(static_cast<const v1::TensorProto&>(proto));
  ASSERT_TRUE(const_decoded.ok()) << const_decoded.status();
  EXPECT_TRUE(torch::equal(*const_decoded, x));
  EXPECT_EQ(RingLeases::Outstanding(), outstanding + 1);

  // Decoding takes the lease over: the tensor reads the ring's pages, and the
  // writer gets the region back only when the tensor is freed.
  int64_t charged = 0;
  DecodeOptions options;
  options.charge = [&charged](int64_t bytes) {
    charged += bytes;
    return [&charged, bytes] { charged -= bytes; };
  };
  auto decoded = DecodeTensor(&proto, options);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(torch::equal(*decoded, x));
  EXPECT_EQ(charged, 128 * 256 * 4);
  EXPECT_EQ(RingLeases::Outstanding(), outstanding);
  EXPECT_GT((*ring)->used(), 0u);
  decoded = absl::InternalError("dropped");  // frees the tensor
  EXPECT_EQ(charged, 0);
  EXPECT_EQ((*view)->held_bytes(), 0u);
  EXPECT_EQ((*ring)->used(), 0u);
}

TEST_F(SharedRingTest, ALeaseFromTheWireIsRefusedAndAnUnreadOneIsReturned) {
  auto ring = SharedRing::Create(dir_, 1 << 20);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  const int owner = 0, other = 0;
  const torch::Tensor x = torch::randn({64, 256});

  // A peer cannot name a lease: only the receiver sets it.
  v1::StageMessage forged = RingMessage(ring->get(), x, 1);
  (*forged.mutable_tensors())["x"].mutable_shared()->set_lease(1);
  absl::Status refused = ResolveSharedPayloads(&forged, view->get(), Lending(&owner));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("tensor.shared.lease"), std::string::npos) << refused;
  ASSERT_TRUE(ResolveSharedPayloads(&forged, view->get(), Lending(nullptr)).code() ==
              absl::StatusCode::kInvalidArgument);
  // (Its region is the writer's again once a proper message took it.)
  (*forged.mutable_tensors())["x"].mutable_shared()->set_lease(0);
  ASSERT_TRUE(ResolveSharedPayloads(&forged, view->get()).ok());

  v1::StageMessage unread = RingMessage(ring->get(), x, 5);
  ASSERT_TRUE(ResolveSharedPayloads(&unread, view->get(), Lending(&owner)).ok());
  ASSERT_GT((*ring)->used(), 0u);
  // Not older than message 5, not this owner's: kept.
  EXPECT_EQ(RingLeases::Reap(&owner, 5), 0);
  EXPECT_EQ(RingLeases::Reap(&other, 100), 0);
  // Message 6 was received: 5's lease goes back and the writer reuses it.
  EXPECT_EQ(RingLeases::Reap(&owner, 6), 1);
  EXPECT_EQ((*ring)->used(), 0u);
  // Read after that, the message fails loudly instead of reading freed pages.
  auto late = DecodeTensor(&(*unread.mutable_tensors())["x"]);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("released"), std::string::npos) << late.status();
  v1::TensorProto late_copy = unread.tensors().at("x");
  EXPECT_FALSE(InlineLentPayload(&late_copy).ok());
}

TEST_F(SharedRingTest, OnlyLargeFloatPayloadsWithinHalfTheRingAreLent) {
  auto ring = SharedRing::Create(dir_, 1 << 20);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  const int owner = 0;
  auto lent = [](const v1::StageMessage& m) { return m.tensors().at("x").has_shared(); };

  // Integers (an index could change under the reader) and narrowed payloads
  // are copied out.
  v1::StageMessage ints = RingMessage(ring->get(), torch::arange(65536), 1);
  v1::StageMessage narrow =
      RingMessage(ring->get(), torch::randn({65536}), 2, v1::COMPRESSION_BF16);
  for (v1::StageMessage* m : {&ints, &narrow}) {
    ASSERT_TRUE(ResolveSharedPayloads(m, view->get(), Lending(&owner)).ok());
    EXPECT_FALSE(lent(*m));
    EXPECT_FALSE(m->tensors().at("x").data().empty());
  }
  // Below lend_min_bytes: copied.
  v1::StageMessage small = RingMessage(ring->get(), torch::randn({1000}), 3);
  ResolveOptions options = Lending(&owner);
  options.lend_min_bytes = 8192;
  ASSERT_TRUE(ResolveSharedPayloads(&small, view->get(), options).ok());
  EXPECT_FALSE(lent(small));

  // Over a quarter of the ring: copied.
  v1::StageMessage large = RingMessage(ring->get(), torch::randn({70000}), 4);
  ASSERT_TRUE(ResolveSharedPayloads(&large, view->get(), Lending(&owner)).ok());
  EXPECT_FALSE(lent(large));

  // 200 KiB payloads: two fit in half the ring's megabyte, the third is
  // copied.
  std::vector<v1::StageMessage> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(RingMessage(ring->get(), torch::randn({51200}), 10 + i));
    ASSERT_TRUE(ResolveSharedPayloads(&held.back(), view->get(), Lending(&owner)).ok());
  }
  EXPECT_TRUE(lent(held[0]));
  EXPECT_TRUE(lent(held[1]));
  EXPECT_FALSE(lent(held[2]));
  EXPECT_EQ(RingLeases::Reap(&owner, std::numeric_limits<int64_t>::max()), 2);
  EXPECT_EQ((*ring)->used(), 0u);
}

// For a receiver on a GPU (lend_narrowed), an fp16/bf16 payload is lent as it
// came: the receiver copies half the bytes up and widens them there.
TEST_F(SharedRingTest, ANarrowedPayloadIsLentAsItCameWhenAsked) {
  auto ring = SharedRing::Create(dir_, 1 << 20);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  const int owner = 0;
  const torch::Tensor x = torch::randn({65536});
  ResolveOptions options = Lending(&owner);
  options.lend_narrowed = true;
  for (v1::Compression compression : {v1::COMPRESSION_BF16, v1::COMPRESSION_FP16}) {
    SCOPED_TRACE(v1::Compression_Name(compression));
    v1::StageMessage m = RingMessage(ring->get(), x, 1, compression);
    ASSERT_TRUE(ResolveSharedPayloads(&m, view->get(), options).ok());
    v1::TensorProto& proto = (*m.mutable_tensors())["x"];
    ASSERT_TRUE(proto.has_shared());
    EXPECT_NE(proto.shared().lease(), 0u);
    EXPECT_EQ(proto.compression(), compression);
    EXPECT_EQ(LentBytes(m), 65536 * 2);
    EXPECT_TRUE(ValidateTensorProto(proto).ok());
    {
      auto decoded = DecodeTensor(&proto, DecodeOptions{});
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      const c10::ScalarType narrow =
          compression == v1::COMPRESSION_FP16 ? torch::kHalf : torch::kBFloat16;
      EXPECT_TRUE(torch::equal(*decoded, x.to(narrow).to(torch::kFloat)));
    }
    EXPECT_EQ((*ring)->used(), 0u) << "widened into a tensor of its own: the region is free";
  }
  // Quantized payloads are never lent.
  v1::StageMessage q = RingMessage(ring->get(), x, 2, v1::COMPRESSION_INT8);
  ASSERT_TRUE(ResolveSharedPayloads(&q, view->get(), options).ok());
  EXPECT_FALSE(q.tensors().at("x").has_shared());
  EXPECT_EQ(RingLeases::Reap(&owner, std::numeric_limits<int64_t>::max()), 0);
}

// For a receiver on the CPU, an fp16/bf16 payload goes into the ring as the
// float32 values the receiver would widen it to, uncompressed, and is read in
// place; a full ring sends it narrowed inline as always.
TEST_F(SharedRingTest, ANarrowedPayloadForACpuReceiverGoesRoundedAndIsReadInPlace) {
  auto ring = SharedRing::Create(dir_, 1 << 22);
  ASSERT_TRUE(ring.ok()) << ring.status();
  auto view = SharedRingView::Open(dir_, (*ring)->name(), (*ring)->size(), (*ring)->token());
  ASSERT_TRUE(view.ok()) << view.status();
  const int owner = 0;
  // More values than one chunk of the rounding, and not a multiple of it.
  torch::Tensor x = torch::randn({70001}) * 1000;
  // Infinities, a value that rounds up to one, a denormal, ties.
  x.narrow(0, 0, 6).copy_(torch::tensor({std::numeric_limits<float>::infinity(),
                                         -std::numeric_limits<float>::infinity(), 3.3961e38f,
                                         1e-40f, 1.00390625f, 1.01171875f}));
  for (v1::Compression compression : {v1::COMPRESSION_BF16, v1::COMPRESSION_FP16}) {
    SCOPED_TRACE(v1::Compression_Name(compression));
    EncodeOptions narrow;
    narrow.compression = compression;
    v1::TensorProto inline_proto;
    ASSERT_TRUE(EncodeTensor(x, &inline_proto, narrow).ok());
    auto widened = DecodeTensor(inline_proto);
    ASSERT_TRUE(widened.ok()) << widened.status();

    EncodeOptions rounded = narrow;
    rounded.ring = ring->get();
    rounded.round_in_ring = true;
    v1::StageMessage m;
    m.set_seq(1);
    ASSERT_TRUE(EncodeTensor(x, &(*m.mutable_tensors())["x"], rounded).ok());
    const v1::TensorProto& sent = m.tensors().at("x");
    ASSERT_TRUE(sent.has_shared());
    EXPECT_EQ(sent.compression(), v1::COMPRESSION_NONE);
    EXPECT_EQ(sent.shared().length(), 70001u * 4);
    ASSERT_TRUE(ResolveSharedPayloads(&m, view->get(), Lending(&owner)).ok());
    EXPECT_NE(m.tensors().at("x").shared().lease(), 0u);
    auto decoded = DecodeTensor(&(*m.mutable_tensors())["x"]);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_TRUE(torch::equal(*decoded, *widened));
    EXPECT_FALSE(torch::equal(*decoded, x));  // rounded, not the float32 values
  }
  // No room in the ring: narrowed inline.
  std::vector<SharedRing::Region> taken;
  for (uint64_t piece : {uint64_t{1} << 20, uint64_t{4096}, uint64_t{64}}) {
    while (auto r = (*ring)->Allocate(piece)) taken.push_back(*r);
  }
  EncodeOptions rounded;
  rounded.compression = v1::COMPRESSION_BF16;
  rounded.ring = ring->get();
  rounded.round_in_ring = true;
  v1::TensorProto full;
  ASSERT_TRUE(EncodeTensor(x, &full, rounded).ok());
  EXPECT_FALSE(full.has_shared());
  EXPECT_EQ(full.compression(), v1::COMPRESSION_BF16);
  EXPECT_EQ(full.data().size(), 70001u * 2);
  for (const auto& r : taken) {
    std::string out;
    ASSERT_TRUE((*view)->Take(r.offset, r.length, &out).ok());
  }
}

}  // namespace
}  // namespace stagewise
