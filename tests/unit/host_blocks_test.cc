// The host block cache (services/tensor/host_blocks.h). Its own binary: the
// cache becomes the process's CPU allocator.
#include "services/tensor/host_blocks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>
#include <vector>

#include "services/models/memory_meter.h"

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

}  // namespace
}  // namespace stagewise
