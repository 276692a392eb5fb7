// The host block cache (services/tensor/host_blocks.h). Its own binary: the
// cache becomes the process's CPU allocator.
#include "services/tensor/host_blocks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "services/models/memory_meter.h"
#include "services/tensor/codec.h"
#include "services/tensor/shared_ring.h"
#include "services/tensor/stage_message.h"

namespace stagewise {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

class HostBlocksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostBlockOptions options;
    options.max_cached_bytes = 64 * kMiB;
    InstallHostBlockCache(options);
  }
};

TEST_F(HostBlocksTest, AFreedLargeTensorsMemoryServesTheNextOfItsSize) {
  const HostBlockStats before = GetHostBlockStats();
  ASSERT_TRUE(before.installed);
  void* first = nullptr;
  {
    torch::Tensor t = torch::empty({4 * kMiB / 4});
    first = t.data_ptr();
    t.fill_(3);
  }
  const HostBlockStats held = GetHostBlockStats();
  EXPECT_EQ(held.fresh, before.fresh + 1);
  EXPECT_GE(held.cached_bytes, before.cached_bytes + 4 * kMiB);
  torch::Tensor again = torch::zeros({4 * kMiB / 4});
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(again.sum().item<float>(), 0.0f);  // zeros() still zeroes a reused block
  const HostBlockStats after = GetHostBlockStats();
  EXPECT_EQ(after.reused, held.reused + 1);
  EXPECT_EQ(after.cached_bytes, held.cached_bytes - (held.cached_bytes - before.cached_bytes));
}

TEST_F(HostBlocksTest, SmallTensorsAndOtherSizesAreNotServedFromTheCache) {
  { torch::Tensor big = torch::empty({12 * kMiB / 4}); }
  const HostBlockStats held = GetHostBlockStats();
  for (int i = 0; i < 100; ++i) torch::Tensor small = torch::ones({1000});
  // Half the size: a cached block twice as large is not handed out.
  torch::Tensor half = torch::empty({6 * kMiB / 4});
  const HostBlockStats after = GetHostBlockStats();
  EXPECT_EQ(after.reused, held.reused);
  EXPECT_EQ(after.fresh, held.fresh + 1);
  EXPECT_EQ(after.cached_bytes, held.cached_bytes);
}

TEST_F(HostBlocksTest, HoldsNoMoreThanItsLimitAndFreesTheRestWhenLowered) {
  {
    std::vector<torch::Tensor> many;
    for (int i = 0; i < 24; ++i) many.push_back(torch::empty({4 * kMiB / 4}));
  }  // 96 MiB freed at once, 64 MiB kept at most
  EXPECT_LE(GetHostBlockStats().cached_bytes, static_cast<uint64_t>(64 * kMiB));
  EXPECT_GE(GetHostBlockStats().cached_bytes, static_cast<uint64_t>(56 * kMiB));
  HostBlockOptions lower;
  lower.max_cached_bytes = 8 * kMiB + kMiB;
  InstallHostBlockCache(lower);
  EXPECT_LE(GetHostBlockStats().cached_bytes, static_cast<uint64_t>(9 * kMiB));
  lower.max_cached_bytes = 0;
  InstallHostBlockCache(lower);
  EXPECT_EQ(GetHostBlockStats().cached_bytes, 0u);
  { torch::Tensor t = torch::empty({4 * kMiB / 4}); }
  EXPECT_EQ(GetHostBlockStats().cached_bytes, 0u);  // off: freed at once
}

TEST_F(HostBlocksTest, TensorsMadeAndFreedOnManyThreadsKeepTheirValues) {
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([k, &wrong] {
      for (int i = 0; i < 50; ++i) {
        torch::Tensor a = torch::full({(1 + i % 3) * kMiB / 4}, static_cast<float>(k * 100 + i));
        torch::Tensor b = a * 2;
        if (b.max().item<float>() != 2.0f * (k * 100 + i) ||
            b.min().item<float>() != 2.0f * (k * 100 + i)) {
          ++wrong[k];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(wrong[k], 0) << "thread " << k;
  EXPECT_GT(GetHostBlockStats().reused, 0);
}

TEST_F(HostBlocksTest, TheMemoryMeterInstalledAfterItCountsTheTensorsItServes) {
  auto account = std::make_shared<models::MemoryAccount>();
  {
    models::ScopedMemoryAccount scope(account);
    { torch::Tensor t = torch::empty({5 * kMiB / 4}); }
    const HostBlockStats held = GetHostBlockStats();
    torch::Tensor again = torch::empty({5 * kMiB / 4});
    EXPECT_EQ(GetHostBlockStats().reused, held.reused + 1);
    EXPECT_EQ(account->current(), 5 * kMiB);
  }
  EXPECT_EQ(account->current(), 0);
  EXPECT_EQ(account->peak(), 5 * kMiB);
}

TEST_F(HostBlocksTest, BlocksAreAlignedAsLibTorchsOwn) {
  for (int64_t n : {int64_t{1}, int64_t{777}, kMiB + 3, 3 * kMiB + 5}) {
    torch::Tensor t = torch::empty({n}, torch::kUInt8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u) << n;
  }
}

// An arena of one 1 MiB buffer (placement, host_blocks.h).
class OneBufferArena final : public HostArena {
 public:
  OneBufferArena() {
    EXPECT_EQ(posix_memalign(&buffer_, 64, kMiB), 0);
    EXPECT_TRUE(RegisterHostArena(this, buffer_, kMiB));
  }
  ~OneBufferArena() override {
    UnregisterHostArena(this);
    std::free(buffer_);
  }
  void* Place(size_t bytes) override {
    if (used_ || bytes > static_cast<size_t>(kMiB)) return nullptr;
    used_ = true;
    return buffer_;
  }
  void Unplace(void* data) override {
    EXPECT_EQ(data, buffer_);
    used_ = false;
    ++unplaced_;
  }
  void* buffer() const { return buffer_; }
  int unplaced() const { return unplaced_; }

 private:
  void* buffer_ = nullptr;
  bool used_ = false;
  int unplaced_ = 0;
};

TEST_F(HostBlocksTest, AllocationsOfThePlacedSizeComeFromTheArenaAndGoBackToIt) {
  OneBufferArena arena;
  const int64_t placed = HostPlacedAllocations();
  torch::Tensor made;
  {
    ScopedHostPlacement place(&arena, 64 * 1024 * 4);
    torch::Tensor other_size = torch::ones({64 * 1024 + 1});
    EXPECT_NE(other_size.data_ptr(), arena.buffer());
    made = torch::full({256, 256}, 2.0f);
    EXPECT_EQ(made.data_ptr(), arena.buffer());
    torch::Tensor arena_full = torch::ones({256, 256});  // its one buffer is taken
    EXPECT_NE(arena_full.data_ptr(), arena.buffer());
    {
      ScopedHostPlacement none(nullptr, 0);  // nested: nothing placed inside
      torch::Tensor inner = torch::ones({256, 256});
      EXPECT_NE(inner.data_ptr(), arena.buffer());
    }
  }
  EXPECT_EQ(HostPlacedAllocations(), placed + 1);
  EXPECT_EQ(made.sum().item<float>(), 2.0f * 256 * 256);
  torch::Tensor after = torch::ones({256, 256});  // the placement ended
  EXPECT_NE(after.data_ptr(), arena.buffer());
  EXPECT_EQ(arena.unplaced(), 0);
  made = torch::Tensor();
  EXPECT_EQ(arena.unplaced(), 1);
}

TEST_F(HostBlocksTest, AnOutputMadeInARingGoesWithoutACopyAndDecodesTheSame) {
  char tmpl[] = "/tmp/host_blocks_test_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  ASSERT_NE(dir, nullptr);
  {
    auto created = SharedRing::Create(dir, 8 << 20);
    ASSERT_TRUE(created.ok()) << created.status();
    std::shared_ptr<SharedRing> ring = std::move(*created);
    auto view = SharedRingView::Open(dir, ring->name(), ring->size(), ring->token());
    ASSERT_TRUE(view.ok()) << view.status();
    const torch::Tensor x = torch::randn({512, 512});
    torch::Tensor y;
    {
      ScopedHostPlacement place(ring.get(), 512 * 512 * 4);
      y = x * 3;  // the stage's output, made in the ring
    }
    ASSERT_TRUE(ring->Contains(y.data_ptr()));
    EncodeOptions wire;
    wire.ring = ring.get();
    const int64_t in_place = SharedRing::TotalPublishedInPlace();
    v1::StageMessage m;
    ASSERT_TRUE(EncodeTensor(y, &(*m.mutable_tensors())["y"], wire).ok());
    EXPECT_EQ(SharedRing::TotalPublishedInPlace(), in_place + 1);
    EXPECT_TRUE(m.tensors().at("y").has_shared());
    // Sent again (a second message): a copy this time, in a region of its own.
    v1::StageMessage again;
    ASSERT_TRUE(EncodeTensor(y, &(*again.mutable_tensors())["y"], wire).ok());
    EXPECT_EQ(SharedRing::TotalPublishedInPlace(), in_place + 1);
    EXPECT_NE(again.tensors().at("y").shared().offset(), m.tensors().at("y").shared().offset());
    for (v1::StageMessage* message : {&m, &again}) {
      ASSERT_TRUE(ResolveSharedPayloads(message, view->get()).ok());
      auto decoded = DecodeTensor(message->tensors().at("y"));
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_TRUE(torch::equal(*decoded, x * 3));
    }
    EXPECT_GT(ring->used(), 0u);  // y still reads its region
    y = torch::Tensor();
    EXPECT_EQ(ring->used(), 0u);

    // fp16/bf16 to a CPU receiver: rounded into a tensor made in the ring.
    for (const v1::Compression c : {v1::COMPRESSION_BF16, v1::COMPRESSION_FP16}) {
      EncodeOptions narrow = wire;
      narrow.compression = c;
      narrow.round_in_ring = true;
      const torch::Tensor rounded = NarrowIntoRing(x, &narrow);
      EXPECT_TRUE(ring->Contains(rounded.data_ptr()));
      EXPECT_EQ(narrow.compression, v1::COMPRESSION_NONE);
      const auto type = c == v1::COMPRESSION_BF16 ? torch::kBFloat16 : torch::kHalf;
      EXPECT_TRUE(torch::equal(rounded, x.to(type).to(torch::kFloat)));
      // Given up (a gradient) and made in the ring: rounded where it lies.
      torch::Tensor grad;
      {
        ScopedHostPlacement place(ring.get(), 512 * 512 * 4);
        grad = x * 2;
      }
      EncodeOptions in_place = narrow;
      in_place.compression = c;
      const torch::Tensor kept = NarrowIntoRing(grad, &in_place, /*given_up=*/false);
      EXPECT_NE(kept.data_ptr(), grad.data_ptr());  // still read: rounded into a region of its own
      EXPECT_TRUE(torch::equal(grad, x * 2));
      in_place.compression = c;
      const torch::Tensor same = NarrowIntoRing(grad, &in_place, /*given_up=*/true);
      EXPECT_EQ(same.data_ptr(), grad.data_ptr());
      EXPECT_EQ(in_place.compression, v1::COMPRESSION_NONE);
      EXPECT_TRUE(torch::equal(same, (x * 2).to(type).to(torch::kFloat)));
      EncodeOptions not_cpu_receiver = wire;  // round_in_ring off: narrowed when sent
      not_cpu_receiver.compression = c;
      EXPECT_EQ(NarrowIntoRing(x, &not_cpu_receiver).data_ptr(), x.data_ptr());
      EXPECT_EQ(not_cpu_receiver.compression, c);
    }
    EXPECT_EQ(ring->used(), 0u);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stagewise
