// The stage runtime's lifecycle without gRPC or a coordinator: a one-stage
// job (no neighbours), its events collected in memory. Start, Stop and Fail
// race from several threads; the stage ends once, with one outcome, reports
// at most one result or error, nothing when stopped, and its first error.
#include "worker/stage_runtime.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"

namespace stagewise::worker {
namespace {

std::string Yaml(int64_t steps) {
  return absl::StrCat(
      "name: lifecycle\n"
      "model: {name: mlp, hidden: [16]}\n"
      "data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [1, 4, 4], classes: 4}\n"
      "batch_size: 16\n"
      "steps: ",
      steps, "\n");
}

// What the stage told the coordinator: its results and errors.
class Events {
 public:
  void Add(const v1::WorkerEvent& e) {
    absl::MutexLock lock(&mu_);
    if (e.has_result()) ++results_;
    if (e.has_error()) errors_.push_back(e.error().message());
    if (e.has_metrics()) ++metrics_;
  }
  int results() const {
    absl::MutexLock lock(&mu_);
    return results_;
  }
  std::vector<std::string> errors() const {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  int metrics() const {
    absl::MutexLock lock(&mu_);
    return metrics_;
  }

 private:
  mutable absl::Mutex mu_;
  int results_ ABSL_GUARDED_BY(mu_) = 0;
  int metrics_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

class StageRuntimeTest : public ::testing::Test {
 protected:
  std::shared_ptr<StageRuntime> Make(int64_t steps) {
    auto spec = ParseJobSpec(Yaml(steps));
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto model = models::BuildModel(spec->model, 0);
    EXPECT_TRUE(model.ok()) << model.status();
    v1::StageAssignment a;
    a.set_job_id("job-1");
    a.set_stage(0);
    a.set_num_stages(1);
    a.set_block_begin(0);
    a.set_block_end(static_cast<int>((*model)->blocks().size()));
    a.set_job_spec_yaml(Yaml(steps));
    RuntimeEnv env;
    env.registry = &registry_;
    env.emit = [this](v1::WorkerEvent e) { events_.Add(e); };
    auto rt = StageRuntime::Create(a, std::move(env));
    EXPECT_TRUE(rt.ok()) << rt.status();
    return rt.ok() ? *rt : nullptr;
  }
  // Waits until the stage has reported some steps.
  void WaitForSteps() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (events_.metrics() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_GT(events_.metrics(), 0) << "the stage never reported a step";
  }

  prometheus::Registry registry_;
  Events events_;
};

TEST_F(StageRuntimeTest, RunsToTheEndAndReportsItsResultOnce) {
  auto rt = Make(8);
  ASSERT_NE(rt, nullptr);
  EXPECT_FALSE(rt->started());
  EXPECT_FALSE(rt->outcome().has_value());
  ASSERT_TRUE(rt->Start().ok());
  EXPECT_TRUE(rt->started());
  rt->Join();
  ASSERT_TRUE(rt->outcome().has_value());
  EXPECT_TRUE(rt->outcome()->ok()) << *rt->outcome();
  EXPECT_FALSE(rt->running());
  EXPECT_EQ(events_.results(), 1);
  EXPECT_TRUE(events_.errors().empty());
  rt->Stop(absl::CancelledError("after the end"));  // changes nothing now
  EXPECT_TRUE(rt->outcome()->ok());
  EXPECT_EQ(events_.results(), 1);
}

TEST_F(StageRuntimeTest, AStoppedStageReportsNothing) {
  auto rt = Make(100000000);
  ASSERT_NE(rt, nullptr);
  ASSERT_TRUE(rt->Start().ok());
  WaitForSteps();
  EXPECT_TRUE(rt->running());
  rt->Stop(absl::CancelledError("the coordinator said stop"));
  rt->Join();
  ASSERT_TRUE(rt->outcome().has_value());
  EXPECT_EQ(rt->outcome()->code(), absl::StatusCode::kCancelled) << *rt->outcome();
  EXPECT_EQ(events_.results(), 0);
  EXPECT_TRUE(events_.errors().empty());
}

TEST_F(StageRuntimeTest, TheFirstErrorIsTheOneReportedOnce) {
  auto rt = Make(100000000);
  ASSERT_NE(rt, nullptr);
  ASSERT_TRUE(rt->Start().ok());
  WaitForSteps();
  rt->Fail(absl::InternalError("the first error"));
  rt->Fail(absl::UnavailableError("an echo of it"));
  rt->Join();
  ASSERT_TRUE(rt->outcome().has_value());
  EXPECT_EQ(rt->outcome()->code(), absl::StatusCode::kInternal) << *rt->outcome();
  EXPECT_EQ(rt->outcome()->message(), "the first error");
  const std::vector<std::string> errors = events_.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(absl::StrContains(errors[0], "the first error")) << errors[0];
  EXPECT_EQ(events_.results(), 0);
}

TEST_F(StageRuntimeTest, StoppedBeforeItStartsItEndsAtOnceWithoutAReport) {
  auto rt = Make(100000000);
  ASSERT_NE(rt, nullptr);
  rt->Stop(absl::CancelledError("never mind"));
  ASSERT_TRUE(rt->Start().ok());
  rt->Join();
  ASSERT_TRUE(rt->outcome().has_value());
  EXPECT_FALSE(rt->outcome()->ok());
  EXPECT_FALSE(rt->running());
  EXPECT_EQ(events_.results(), 0);
  EXPECT_TRUE(events_.errors().empty());
}

// Start, Stop, Fail and Join from four threads in varying orders: one
// outcome, at most one report, never a result, and a reported error is the
// outcome (the failure, not the stop).
TEST_F(StageRuntimeTest, RacingStartStopFailAndJoinEndOnce) {
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto rt = Make(100000000);
    ASSERT_NE(rt, nullptr);
    const int before_results = events_.results();
    const size_t before_errors = events_.errors().size();
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    auto wait = [&go] {
      while (!go) std::this_thread::yield();
    };
    threads.emplace_back([&] {
      wait();
      EXPECT_TRUE(rt->Start().ok());
    });
    threads.emplace_back([&] {
      wait();
      absl::SleepFor(absl::Microseconds(round * 50));
      rt->Fail(absl::InternalError(absl::StrCat("failure ", round)));
    });
    threads.emplace_back([&] {
      wait();
      absl::SleepFor(absl::Microseconds((19 - round) * 50));
      rt->Stop(absl::CancelledError("stop"));
    });
    threads.emplace_back([&] {
      wait();
      rt->Join();
    });
    go = true;
    for (auto& t : threads) t.join();
    rt->Join();
    ASSERT_TRUE(rt->outcome().has_value());
    EXPECT_FALSE(rt->outcome()->ok());
    EXPECT_FALSE(rt->running());
    const std::vector<std::string> errors = events_.errors();
    const size_t reported = errors.size() - before_errors;
    EXPECT_EQ(events_.results(), before_results);
    EXPECT_LE(reported, 1u);
    if (reported == 1) {
      EXPECT_TRUE(absl::StrContains(errors.back(), rt->outcome()->message())) << errors.back();
      EXPECT_EQ(rt->outcome()->code(), absl::StatusCode::kInternal);
    }
    rt.reset();  // destroyed without waiting for anything more
  }
}

TEST_F(StageRuntimeTest, DestroyingARunningStageStopsItWithoutAReport) {
  auto rt = Make(100000000);
  ASSERT_NE(rt, nullptr);
  ASSERT_TRUE(rt->Start().ok());
  WaitForSteps();
  rt.reset();
  EXPECT_EQ(events_.results(), 0);
  EXPECT_TRUE(events_.errors().empty());
}

}  // namespace
}  // namespace stagewise::worker
