// ReplicaGroup (worker/collective.h) and StageReplicas (worker/stage_replicas.h):
// R replicas as threads of this process,
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
#include "services/checkpoint/shard_archive.h"
#include "worker/overlap.h"
#include "worker/replica_copy.h"
#include "worker/stage_replicas.h"

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

// OverlappedAverage: a small network per replica, two micro-batches of its own
// data; the last backward runs armed. Every replica ends with the mean of the
// replicas' accumulated gradients (as AverageGradients after the backward
// would give), and with small buckets some start while the backward runs.
struct Net : torch::nn::Module {
  Net() {
    // First in the parameter list, so last in the buckets' (reversed) order.
    unused = register_module("unused", torch::nn::Linear(2, 2));
    a = register_module("a", torch::nn::Linear(6, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
    c = register_module("c", torch::nn::Linear(8, 3));
    // The same values on every thread without the (shared) global generator.
    torch::NoGradGuard no_grad;
    int i = 0;
    for (auto& p : parameters()) {
      p.copy_(torch::sin(torch::arange(p.numel(), p.options()) * 0.37 + i++).view_as(p) * 0.4);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return c->forward(torch::relu(b->forward(torch::relu(a->forward(x)))));
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, unused{nullptr};
};

// Micro-batch m of replica `rank`'s share.
torch::Tensor Input(int rank, int m) {
  return torch::cos(torch::arange(24, torch::kFloat) * (0.1 + 0.05 * rank) + m).view({4, 6});
}

// `net`'s accumulated gradients over two micro-batches; `before_last` runs
// before the second backward.
void TwoMicroBatches(int rank, Net& net, const std::function<void()>& before_last) {
  for (int m = 0; m < 2; ++m) {
    torch::Tensor loss = net.forward(Input(rank, m)).square().mean();
    if (m == 1) before_last();
    loss.backward();
  }
}

TEST(OverlappedAverage, EqualsAveragingAfterTheBackward) {
  constexpr int kSize = 2;
  for (int64_t bucket : {int64_t{1} << 20, int64_t{64}}) {
    SCOPED_TRACE(bucket);
    ReplicaGroupOptions options;
    options.timeout = absl::Seconds(30);
    std::vector<std::vector<torch::Tensor>> want(kSize), got(kSize);
    std::vector<int64_t> early(kSize);
    OnReplicas(kSize, options, [&](int rank, ReplicaGroup& group) {
      Net plain;
      TwoMicroBatches(rank, plain, [] {});
      ASSERT_TRUE(group.AverageGradients(plain.parameters()).ok());
      for (const auto& p : plain.parameters()) want[rank].push_back(p.grad().clone());

      Net net;
      OverlappedAverage overlap(&group, net.parameters(), bucket);
      for (int step = 0; step < 2; ++step) {  // the hooks stay for every step
        for (auto& p : net.parameters()) p.mutable_grad() = torch::Tensor();
        TwoMicroBatches(rank, net, [&] { overlap.Arm(); });
        ASSERT_TRUE(overlap.armed());
        ASSERT_TRUE(overlap.Finish().ok());
        EXPECT_FALSE(overlap.armed());
      }
      for (const auto& p : net.parameters()) got[rank].push_back(p.grad().clone());
      early[rank] = overlap.started_early();
    });
    ASSERT_EQ(got[0].size(), want[0].size());
    for (size_t i = 0; i < got[0].size(); ++i) {
      for (int r = 0; r < kSize; ++r) {
        EXPECT_TRUE(torch::allclose(got[r][i], want[0][i], 1e-6, 1e-7)) << "param " << i;
      }
    }
    // Small buckets: all but the unused layer's (the last) start during the
    // backward, as soon as their gradients are final.
    if (bucket == 64) {
      EXPECT_EQ(early[0], 2 * 6);  // two steps, six buckets each
      EXPECT_EQ(early[1], 2 * 6);
    } else {
      EXPECT_EQ(early[0], 0);  // one bucket, completed only by Finish
    }
  }
}

TEST(OverlappedAverage, FinishWithoutArmIsAnError) {
  auto group = ReplicaGroup::Create(c10::make_intrusive<c10d::HashStore>(), {});
  ASSERT_TRUE(group.ok());
  Net net;
  OverlappedAverage overlap(group->get(), net.parameters(), 1 << 20);
  EXPECT_EQ(overlap.Finish().code(), absl::StatusCode::kFailedPrecondition);
}

// The mean of Params(0)'s and Params(1)'s gradients.
std::vector<torch::Tensor> MeanOfTwo() {
  std::vector<torch::Tensor> mean;
  std::vector<torch::Tensor> a = Params(0), b = Params(1);
  for (size_t i = 0; i < a.size(); ++i) mean.push_back((a[i].grad() + b[i].grad()) / 2);
  return mean;
}

// Replacing a replica (recovery.replay): replica 1 is lost; replica 0's
// average fails, keeps its gradients, waits for Regroup, publishes its state
// (it is the source), meets the replacement in generation 1's group and
// averages the same gradients with it.
TEST(StageReplicas, ASurvivorAveragesTheSameGradientsAgainWithTheReplacement) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ReplicaGroupOptions options;
  options.size = 2;
  options.timeout = absl::Seconds(30);
  options.name = "stage 0";
  StageReplicas survivor(SyncSpec{}, nullptr);
  std::atomic<int> published{0};
  std::atomic<bool> released{false};
  std::string token;
  survivor.EnableRegroup({.publish =
                              [&](int generation, const std::string& t) {
                                token = t;
                                published = generation;
                                return absl::OkStatus();
                              },
                          .release = [&] { released = true; }});
  std::thread lost([&] {
    ReplicaGroupOptions o = options;
    o.rank = 1;
    auto group = ReplicaGroup::Create(store, o);
    ASSERT_TRUE(group.ok()) << group.status();
    // Destroyed without averaging: its connections close.
  });
  options.rank = 0;
  ASSERT_TRUE(survivor.Join(store, options).ok());
  lost.join();
  std::vector<torch::Tensor> params = Params(0);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1));
  absl::Status averaged = absl::UnknownError("not run");
  std::thread step([&] { averaged = survivor.AverageGradients(optimizer, nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(published.load(), 0);  // nothing before the coordinator's word
  survivor.Regroup(1, /*source=*/true, "secret");

  StageReplicas replacement(SyncSpec{}, nullptr);
  ReplicaGroupOptions o = options;
  o.rank = 1;
  ASSERT_TRUE(replacement.Join(store, o, /*generation=*/1).ok());
  std::vector<torch::Tensor> theirs = Params(1);
  torch::optim::SGD their_optimizer(theirs, torch::optim::SGDOptions(0.1));
  ASSERT_TRUE(replacement.AverageGradients(their_optimizer, nullptr).ok());
  step.join();
  ASSERT_TRUE(averaged.ok()) << averaged;
  EXPECT_EQ(published.load(), 1);
  EXPECT_EQ(token, "secret");
  EXPECT_TRUE(released.load());
  EXPECT_EQ(survivor.generation(), 1);
  const std::vector<torch::Tensor> mean = MeanOfTwo();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i].grad(), mean[i])) << "param " << i;
    EXPECT_TRUE(torch::allclose(theirs[i].grad(), mean[i])) << "param " << i;
  }
}

// A stop while a survivor waits for the replacement ends the wait with its
// reason; without EnableRegroup a failed average is the stage's error.
TEST(StageReplicas, AStopEndsTheWaitForAReplacement) {
  for (const bool regroup : {true, false}) {
    SCOPED_TRACE(regroup);
    auto store = c10::make_intrusive<c10d::HashStore>();
    ReplicaGroupOptions options;
    options.size = 2;
    options.timeout = absl::Seconds(30);
    StageReplicas survivor(SyncSpec{}, nullptr);
    if (regroup) {
      survivor.EnableRegroup(
          {.publish = [](int, const std::string&) { return absl::OkStatus(); }, .release = [] {}});
    }
    std::thread lost([&] {
      ReplicaGroupOptions o = options;
      o.rank = 1;
      ASSERT_TRUE(ReplicaGroup::Create(store, o).ok());
    });
    options.rank = 0;
    ASSERT_TRUE(survivor.Join(store, options).ok());
    lost.join();
    std::vector<torch::Tensor> params = Params(0);
    torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1));
    absl::Status averaged;
    std::thread step([&] { averaged = survivor.AverageGradients(optimizer, nullptr); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    survivor.Cancel(absl::CancelledError("job stopped"));
    step.join();
    if (regroup) {
      EXPECT_EQ(averaged.code(), absl::StatusCode::kCancelled) << averaged;
      EXPECT_THAT(averaged.message(), HasSubstr("job stopped"));
      // The gradients are this replica's own still.
      const std::vector<torch::Tensor> mine = Params(0);
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::equal(params[i].grad(), mine[i].grad())) << "param " << i;
      }
    } else {
      EXPECT_FALSE(averaged.ok());
      EXPECT_NE(averaged.code(), absl::StatusCode::kCancelled) << averaged;
    }
  }
}

// A source replica publishes the step's start: its parameters as they are
// (unchanged until the optimizer step), its buffers (BatchNorm's running
// statistics, which the step's forwards moved) as they were when the step
// began; its own buffers are left as the forwards made them. The copy is
// served in pieces, with the token only.
TEST(ReplicaCopy, PublishesTheStepsStartAndServesItInPieces) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  model->train();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  ReplicaCopy copy;
  checkpoint::ShardPosition at;
  at.stage = 1;
  at.block_begin = 2;
  at.block_end = 4;
  EXPECT_EQ(copy.Publish(1, "t", at, 0, *model, optimizer).code(),
            absl::StatusCode::kFailedPrecondition);  // no step began
  checkpoint::ShardPosition::Marks marks{7, 6, 5, 4};
  copy.NoteStepStart(/*phase_step=*/3, marks, *model);
  const torch::Tensor start_mean = model[1]->as<torch::nn::BatchNorm1d>()->running_mean.clone();
  model->forward(torch::randn({8, 4})).sum().backward();  // the step's forward moves the stats
  const torch::Tensor moved = model[1]->as<torch::nn::BatchNorm1d>()->running_mean.clone();
  ASSERT_FALSE(torch::equal(start_mean, moved));
  ASSERT_TRUE(copy.Publish(2, "secret", at, /*phase_offset=*/10, *model, optimizer).ok());
  EXPECT_TRUE(torch::equal(model[1]->as<torch::nn::BatchNorm1d>()->running_mean, moved));

  v1::CopyReplicaRequest request;
  request.set_generation(2);
  request.set_token("wrong");
  v1::CopyReplicaResponse piece;
  EXPECT_EQ(copy.Serve(request, &piece).code(), absl::StatusCode::kPermissionDenied);
  request.set_token("secret");
  request.set_generation(1);
  EXPECT_EQ(copy.Serve(request, &piece).code(), absl::StatusCode::kUnavailable);
  request.set_generation(2);
  ASSERT_TRUE(copy.Serve(request, &piece).ok());
  std::string bytes = piece.data();
  while (static_cast<int64_t>(bytes.size()) < piece.total_bytes()) {
    request.set_offset(static_cast<int64_t>(bytes.size()));
    ASSERT_TRUE(copy.Serve(request, &piece).ok());
    bytes += piece.data();
  }
  auto shard = checkpoint::ShardReader::Parse(bytes, torch::kCPU, "copy");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->position().step, 13);
  EXPECT_EQ((*shard)->position().phase_step, 3);
  EXPECT_EQ((*shard)->position().marks.sent_next, 7);
  torch::nn::Sequential loaded(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  ASSERT_TRUE((*shard)->LoadModel(*loaded).ok());
  EXPECT_TRUE(torch::equal(loaded[1]->as<torch::nn::BatchNorm1d>()->running_mean, start_mean));
  EXPECT_TRUE(torch::equal(loaded[0]->as<torch::nn::Linear>()->weight,
                           model[0]->as<torch::nn::Linear>()->weight));
  copy.Release();
  EXPECT_EQ(copy.Serve(request, &piece).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace stagewise::worker
