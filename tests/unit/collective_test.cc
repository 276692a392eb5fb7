// ReplicaGroup (worker/collective.h): R replicas as threads of this process,
// meeting through one c10d HashStore, talking real gloo over loopback TCP.
#include "worker/collective.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stagewise::worker {
namespace {

using ::testing::HasSubstr;

// Runs body(rank, group) on `size` threads, each with its own ReplicaGroup.
void OnReplicas(int size, ReplicaGroupOptions options,
                const std::function<void(int, ReplicaGroup&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ReplicaGroupOptions o = options;
      o.rank = r;
      o.size = size;
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("job/attempt0/stage0", store);
      auto group = ReplicaGroup::Create(prefixed, o);
      ASSERT_TRUE(group.ok()) << group.status();
      body(r, **group);
    });
  }
  for (auto& t : threads) t.join();
}

// Parameters of one shape list, with gradients that differ per rank.
std::vector<torch::Tensor> Params(int rank, bool skip_second_grad = false) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params = {torch::randn({5, 3}), torch::randn({7}),
                                       torch::randn({2, 2, 2}), torch::randn({4}, torch::kDouble)};
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].set_requires_grad(true);
    if (skip_second_grad && i == 1) continue;
    params[i].mutable_grad() =
        torch::full_like(params[i], static_cast<double>(rank + 1)) *
            (static_cast<double>(i) + 0.5) +
        torch::arange(params[i].numel(), params[i].options()).view_as(params[i]) * rank;
  }
  return params;
}

TEST(ReplicaGroup, AverageGradientsGivesEveryReplicaTheMean) {
  constexpr int kSize = 3;
  for (int64_t bucket :
       {int64_t{1} << 20, int64_t{40}}) {  // one bucket; several (and split dtypes)
    ReplicaGroupOptions options;
    options.bucket_bytes = bucket;
    options.timeout = absl::Seconds(30);
    std::vector<std::vector<torch::Tensor>> got(kSize);
    OnReplicas(kSize, options, [&](int rank, ReplicaGroup& group) {
      std::vector<torch::Tensor> params = Params(rank);
      ASSERT_TRUE(group.AverageGradients(params).ok());
      for (const auto& p : params) got[rank].push_back(p.grad().clone());
      EXPECT_GT(group.bytes(), 0);
    });
    for (size_t i = 0; i < got[0].size(); ++i) {
      torch::Tensor want;
      for (int r = 0; r < kSize; ++r) {
        const torch::Tensor g = Params(r)[i].grad();
        want = want.defined() ? want + g : g.clone();
      }
      want /= kSize;
      for (int r = 0; r < kSize; ++r) {
        EXPECT_TRUE(torch::allclose(got[r][i], want))
            << "bucket " << bucket << " tensor " << i << " replica " << r;
        EXPECT_EQ(got[r][i].scalar_type(), want.scalar_type());
      }
    }
  }
}

TEST(ReplicaGroup, AMissingGradientCountsAsZeros) {
  std::vector<torch::Tensor> second(2);
  OnReplicas(2, {}, [&](int rank, ReplicaGroup& group) {
    std::vector<torch::Tensor> params = Params(rank, /*skip_second_grad=*/rank == 1);
    ASSERT_TRUE(group.AverageGradients(params).ok());
    ASSERT_TRUE(params[1].grad().defined());
    second[rank] = params[1].grad().clone();
  });
  const torch::Tensor want = Params(0)[1].grad() / 2;
  EXPECT_TRUE(torch::allclose(second[0], want));
  EXPECT_TRUE(torch::allclose(second[1], want));
}

TEST(ReplicaGroup, BroadcastCopiesReplicaZerosValuesAndAverageAveragesInPlace) {
  std::vector<torch::Tensor> broadcast(3), averaged(3);
  OnReplicas(3, {}, [&](int rank, ReplicaGroup& group) {
    torch::Tensor a = torch::full({3, 2}, static_cast<double>(rank)).t();  // not contiguous
    ASSERT_TRUE(group.Broadcast({a}).ok());
    broadcast[rank] = a.clone();
    torch::Tensor b = torch::full({4}, static_cast<float>(3 * rank));
    ASSERT_TRUE(group.Average({b}).ok());
    averaged[rank] = b.clone();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(torch::equal(broadcast[r], torch::zeros({2, 3}, torch::kDouble))) << r;
    EXPECT_TRUE(torch::allclose(averaged[r], torch::full({4}, 3.0f))) << r;
  }
}

TEST(ReplicaGroup, AStuckPeerBecomesADeadlineErrorNotAHang) {
  ReplicaGroupOptions options;
  options.timeout = absl::Seconds(2);
  options.name = "stage 1";
  absl::Status first, second;
  std::atomic<bool> done{false};
  OnReplicas(2, options, [&](int rank, ReplicaGroup& group) {
    if (rank == 1) {  // joins, stays connected, never takes part in the all-reduce
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    std::vector<torch::Tensor> params = Params(rank);
    const absl::Time start = absl::Now();
    first = group.AverageGradients(params);
    EXPECT_LT(absl::Now() - start, absl::Seconds(60));
    second = group.AverageGradients(params);
    done = true;
  });
  EXPECT_EQ(first.code(), absl::StatusCode::kDeadlineExceeded) << first;
  EXPECT_THAT(first.message(), HasSubstr("stage 1: all-reduce among 2 replicas failed"));
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
}

TEST(ReplicaGroup, AMissingPeerAtRendezvousIsAnErrorNamingTheGroup) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ReplicaGroupOptions options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Seconds(1);
  options.name = "stage 0";
  auto group = ReplicaGroup::Create(store, options);
  ASSERT_FALSE(group.ok());
  EXPECT_THAT(group.status().message(), HasSubstr("stage 0: replica 0 of 2 could not meet"));
}

TEST(ReplicaGroup, OneReplicaNeedsNoPeersAndChangesNothing) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = ReplicaGroup::Create(store, {});
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<torch::Tensor> params = Params(2);
  const torch::Tensor before = params[0].grad().clone();
  ASSERT_TRUE((*group)->AverageGradients(params).ok());
  EXPECT_TRUE(torch::equal(params[0].grad(), before));
}

TEST(ReplicaGroup, BadRankIsRefused) {
  ReplicaGroupOptions options;
  options.rank = 2;
  options.size = 2;
  auto group = ReplicaGroup::Create(c10::make_intrusive<c10d::HashStore>(), options);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagewise::worker
