// The coordinator and workers as a system: real gRPC on port 0, in-process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "clients/client/coordinator_client.h"
#include "services/rpc/server.h"
#include "services/tensor/ring_leases.h"
#include "services/tensor/shared_ring.h"
#include "tests/integration/cluster.h"

namespace stagewise {
namespace {

std::string Job(int stages, int64_t steps, const std::string& extra = "") {
  return absl::StrCat(R"(name: small
seed: 1
model: {name: mlp, hidden: [32, 32, 16]}
data: {dataset: synthetic, train_size: 256, test_size: 64, shape: [1, 8, 8], classes: 4}
stages: )",
                      stages, "\noptimizer: {lr: 0.05}\nbatch_size: 16\nsteps: ", steps, "\n",
                      extra);
}

// Both workers become idle again and run a 2-stage job of `steps` to the end.
void ExpectTwoWorkersRunAnotherJob(testing::Cluster& cluster, int64_t steps) {
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto next = cluster.manager().Submit(Job(2, steps));
  ASSERT_TRUE(next.ok()) << next.status();
  auto done = cluster.WaitForJob(*next);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
}

// A stream is bound to a stage by its first valid message; until then it may
// be anyone's, so a malformed first message refuses that stream alone (a bad
// message on the bound stream still fails the job: StageRuntime::InboxSink).
TEST(Distributed, MalformedFirstMessageIsRefusedAndTheJobTrainsOn) {
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(Job(2, 1000000));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(cluster.WaitForState(*id, v1::RUNNING));

  // Find the worker holding stage 1 and speak to it as a rogue stage 0.
  worker::Worker* target = nullptr;
  for (auto& w : cluster.workers()) {
    auto rt = w->runtime();
    if (rt && rt->job_id() == *id && rt->stage() == 1) target = w.get();
  }
  ASSERT_NE(target, nullptr);
  auto channel = rpc::MakeChannel(target->address());
  auto stub = v1::StageService::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Exchange(&ctx);
  v1::StageMessage bad;
  bad.set_job_id(*id);
  bad.set_kind(v1::StageMessage::FORWARD);
  auto& t = (*bad.mutable_tensors())["x"];
  t.set_dtype(v1::DTYPE_FLOAT32);
  t.add_shape(2);
  t.add_shape(3);
  t.set_data("short");
  stream->Write(bad);
  stream->WritesDone();
  v1::StageMessage ignored;
  while (stream->Read(&ignored)) {
  }
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("tensors['x']"), std::string::npos) << s.error_message();

  auto before = cluster.manager().GetJob(*id);
  ASSERT_TRUE(before.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int64_t step = before->step();
  while (absl::Now() < deadline && step <= before->step() + 3) {
    absl::SleepFor(absl::Milliseconds(50));
    auto now = cluster.manager().GetJob(*id);
    ASSERT_TRUE(now.ok());
    ASSERT_EQ(now->state(), v1::RUNNING) << now->reason();
    step = now->step();
  }
  EXPECT_GT(step, before->step() + 3) << "the job stopped training";
  ASSERT_TRUE(cluster.manager().Cancel(*id, "enough").ok());
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::CANCELLED);

  // Both workers are still up and run the next job to the end.
  ExpectTwoWorkersRunAnotherJob(cluster, 5);
}

// The metric history `stagewise plot` draws, through the coordinator's RPC.
// Neighbours on one host pass large payloads through shared rings (the
// default) or inline on the stream: the same numbers either way, also with
// activations and gradients narrowed to bf16 straight into the ring.
TEST(Distributed, SameHostPayloadsThroughSharedMemoryTrainExactlyAsInline) {
  // 16 samples of 16 x 32 x 32 per micro-batch: 1 MiB in float32, read in
  // place by the receiver; with bf16, rounded float32 through the ring (the
  // stages are on the CPU), read in place too, and 512 KiB narrowed inline.
  const std::string job = R"(name: same-host
seed: 5
model: {name: emulated, depth: 4, forward_ms: 0, backward_ms: 0, reversible: false}
data: {dataset: synthetic, train_size: 256, test_size: 64, shape: [16, 32, 32], classes: 4}
stages: 3
algorithm: {name: backprop, micro_batches: 2}
optimizer: {lr: 0.01}
batch_size: 32
steps: 12
transport: {compression: COMPRESSION}
eval: {at_end: true}
)";
  for (const std::string compression : {"bf16", "none"}) {
    std::vector<v1::JobStatus> results;
    for (const bool shared : {true, false}) {
      SCOPED_TRACE(absl::StrCat(compression, shared ? ", shared memory" : ", inline"));
      testing::Cluster::Options options{.workers = 3};
      if (!shared) options.shared_memory_dir.clear();
      testing::Cluster cluster(options);
      ASSERT_TRUE(cluster.WaitForWorkers(3));
      const int64_t before = SharedRing::TotalPayloads();
      const int64_t lent_before = RingLeases::TotalLent();
      auto id = cluster.manager().Submit(absl::StrReplaceAll(job, {{"COMPRESSION", compression}}));
      ASSERT_TRUE(id.ok()) << id.status();
      auto done = cluster.WaitForJob(*id);
      ASSERT_TRUE(done.ok());
      ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
      // 12 steps x 2 micro-batches x 2 boundaries, forward and backward, and
      // the evaluation's activations.
      const int64_t lent = RingLeases::TotalLent() - lent_before;
      if (shared) {
        EXPECT_GE(SharedRing::TotalPayloads() - before, 12 * 2 * 2 * 2);
        EXPECT_GE(lent, 12 * 2 * 2 * 2);
      } else {
        EXPECT_EQ(SharedRing::TotalPayloads(), before);
        EXPECT_EQ(lent, 0);
      }
      // Every lease was taken or returned.
      EXPECT_EQ(RingLeases::Outstanding(), 0);
      results.push_back(*done);
    }
    ASSERT_EQ(results.size(), 2u);
    // The evaluation at the end sees the final parameters (train_loss is a
    // mean over whichever steps a paced report covered).
    EXPECT_GT(results[0].eval_loss(), 0);
    EXPECT_EQ(results[0].eval_loss(), results[1].eval_loss());
    EXPECT_EQ(results[0].eval_accuracy(), results[1].eval_accuracy());
  }
}

TEST(Distributed, AFinishedJobsMetricHistoryComesBackInOrderAndThinned) {
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  // Long enough for several reports (they come at most 4 times a second):
  // emulated blocks wait 4 ms per step whatever the machine.
  auto id = cluster.manager().Submit(R"(name: history
model: {name: emulated, depth: 2, forward_ms: 1, backward_ms: 3, reversible: false}
data: {dataset: synthetic, train_size: 512, test_size: 64, shape: [2, 4, 4], classes: 4}
stages: 2
optimizer: {lr: 0.01}
batch_size: 16
steps: 300
eval: {every_steps: 150, every_epochs: 0}
)");
  ASSERT_TRUE(id.ok()) << id.status();
  auto done = cluster.WaitForJob(*id);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();

  client::CoordinatorClient client(cluster.coordinator_address(), absl::Seconds(10));
  auto metrics = client.GetJobMetrics(*id);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->job_id(), *id);
  std::map<std::string, std::vector<v1::MetricSample>> by_name;
  for (const auto& s : metrics->samples()) by_name[s.name()].push_back(s);
  ASSERT_GE(by_name["train_loss"].size(), 3u);
  int64_t last_step = -1, last_ms = 0;
  for (const auto& s : by_name["train_loss"]) {
    EXPECT_GE(s.step(), last_step);
    EXPECT_GE(s.unix_ms(), last_ms);
    EXPECT_TRUE(std::isfinite(s.value()));
    last_step = s.step();
    last_ms = s.unix_ms();
  }
  EXPECT_EQ(last_step, 300);
  // Two evaluations (steps 150 and 300), accuracy as a fraction.
  ASSERT_EQ(by_name["eval_accuracy"].size(), 2u);
  EXPECT_EQ(by_name["eval_accuracy"][0].step(), 150);
  EXPECT_EQ(by_name["eval_accuracy"][1].step(), 300);
  for (const auto& s : by_name["eval_accuracy"]) {
    EXPECT_GE(s.value(), 0.0);
    EXPECT_LE(s.value(), 1.0);
  }
  // Thinned to 3 points of one metric: the first and the last are kept.
  auto thin = cluster.manager().JobMetrics(*id, {"train_loss"}, 3);
  ASSERT_TRUE(thin.ok()) << thin.status();
  ASSERT_EQ(thin->samples_size(), 3);
  EXPECT_EQ(thin->samples(0).step(), by_name["train_loss"].front().step());
  EXPECT_EQ(thin->samples(2).step(), 300);
  for (const auto& s : thin->samples()) EXPECT_EQ(s.name(), "train_loss");
  // Unknown jobs are NOT_FOUND; absurd requests are refused.
  EXPECT_EQ(client.GetJobMetrics("job-nope").status().code(), absl::StatusCode::kNotFound);
}

// The pipeline timeline `stagewise trace` draws, through the coordinator's
// RPC: spans of the window only, one track per stage that never overlaps,
// on the coordinator's clock; the per-stage limit; jobs without a trace.
TEST(Distributed, AJobsTraceComesBackPerStageWithinItsWindowAndLimit) {
  testing::Cluster cluster({.workers = 3});
  ASSERT_TRUE(cluster.WaitForWorkers(3));
  auto job = [](const std::string& trace) {
    return R"(name: traced
model: {name: emulated, depth: 3, forward_ms: 2, backward_ms: 4, reversible: false}
data: {dataset: synthetic, train_size: 512, test_size: 64, shape: [2, 4, 4], classes: 4}
algorithm: {name: backprop, micro_batches: 4, schedule: 1f1b}
stages: 3
optimizer: {lr: 0.01}
batch_size: 16
steps: 8
eval: {every_epochs: 0, at_end: false}
)" + trace;
  };
  client::CoordinatorClient client(cluster.coordinator_address(), absl::Seconds(10));
  const int64_t before_us = absl::ToUnixMicros(absl::Now());
  auto id = cluster.manager().Submit(job("trace: {steps: [2, 5]}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto done = cluster.WaitForJob(*id);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  const int64_t after_us = absl::ToUnixMicros(absl::Now());

  auto trace = client.GetJobTrace(*id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->job_id(), *id);
  EXPECT_EQ(trace->name(), "traced");
  EXPECT_EQ(trace->algorithm(), "backprop");
  EXPECT_EQ(trace->num_stages(), 3);
  ASSERT_EQ(trace->stages_size(), 3);
  std::map<std::pair<int, int64_t>, const v1::Span*> forward_of;  // (stage, step*8+mb)
  int64_t rtt = 0;
  for (int j = 0; j < 3; ++j) {
    const v1::StageTrace& st = trace->stages(j);
    EXPECT_EQ(st.stage(), j);
    EXPECT_EQ(st.dropped(), 0);
    EXPECT_GE(st.clock_rtt_us(), 0) << "stage " << j << " had no clock estimate";
    rtt = std::max(rtt, st.clock_rtt_us());
    std::set<v1::SpanKind> kinds;
    for (int i = 0; i < st.spans_size(); ++i) {
      const v1::Span& s = st.spans(i);
      kinds.insert(s.kind());
      EXPECT_GE(s.step(), 2);
      EXPECT_LT(s.step(), 5);
      // On the coordinator's clock, inside the job's lifetime.
      EXPECT_GE(s.start_us(), before_us - 1'000'000);
      EXPECT_LE(s.start_us() + s.duration_us(), after_us + 1'000'000);
      if (i > 0) {
        const v1::Span& p = st.spans(i - 1);
        EXPECT_LE(p.start_us() + p.duration_us(), s.start_us())
            << "stage " << j << ": " << p.ShortDebugString() << " overlaps "
            << s.ShortDebugString();
      }
      if (s.kind() == v1::SPAN_FORWARD) {
        // The emulated block waits 2 ms per mini-batch forward, 0.5 ms
        // per micro-batch of 4 samples (the last stage's includes the loss).
        EXPECT_GE(s.duration_us(), 500) << s.ShortDebugString();
        forward_of[{j, s.step() * 8 + s.micro_batch()}] = &s;
      }
    }
    for (const v1::SpanKind k : {v1::SPAN_FORWARD, v1::SPAN_BACKWARD, v1::SPAN_STEP}) {
      EXPECT_TRUE(kinds.count(k)) << "stage " << j << " has no " << v1::SpanKind_Name(k);
    }
    EXPECT_TRUE(kinds.count(j == 0 ? v1::SPAN_WAIT_NEXT : v1::SPAN_WAIT_PREV)) << "stage " << j;
  }
  // Three mini-batches of four micro-batches on every stage, and each one's
  // forward on stage j after stage j-1's (within the clocks' uncertainty).
  for (int j = 0; j < 3; ++j) {
    for (int64_t key = 2 * 8; key < 5 * 8; ++key) {
      if (key % 8 >= 4) continue;
      ASSERT_TRUE(forward_of.count(std::make_pair(j, key)))
          << "stage " << j << " step " << key / 8 << " mb " << key % 8;
      if (j == 0) continue;
      const v1::Span* below = forward_of[{j - 1, key}];
      const v1::Span* here = forward_of[{j, key}];
      EXPECT_LE(below->start_us() + below->duration_us(), here->start_us() + rtt)
          << "stage " << j << " step " << key / 8 << " mb " << key % 8;
    }
  }

  // The limit per stage: the rest is counted.
  id = cluster.manager().Submit(job("trace: {steps: [0, 8], max_spans: 20}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  done = cluster.WaitForJob(*id);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  trace = client.GetJobTrace(*id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->stages_size(), 3);
  for (const v1::StageTrace& st : trace->stages()) {
    EXPECT_EQ(st.spans_size(), 20);
    EXPECT_GT(st.dropped(), 0);
  }

  // A job without a trace section has none; unknown jobs are NOT_FOUND.
  id = cluster.manager().Submit(job(""));
  ASSERT_TRUE(id.ok()) << id.status();
  done = cluster.WaitForJob(*id);
  ASSERT_TRUE(done.ok());
  trace = client.GetJobTrace(*id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->stages_size(), 0);
  EXPECT_EQ(client.GetJobTrace("job-nope").status().code(), absl::StatusCode::kNotFound);
}

// placement.per_worker_profiles (docs/planner.md, "Heterogeneous workers"):
// with one worker's emulated device half as fast, the plan made from every
// worker's profile gives the slow worker's stage fewer blocks; the one
// profile of a single worker cuts the model as if both were equal.
TEST(Distributed, EachWorkersProfileGivesTheSlowWorkerTheShorterStage) {
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() /
      absl::StrCat("stagewise-hetero-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
  std::filesystem::create_directories(cache);
  setenv("STAGEWISE_PROFILE_CACHE", cache.c_str(), 1);
  absl::Cleanup cleanup = [&] {
    unsetenv("STAGEWISE_PROFILE_CACHE");
    std::filesystem::remove_all(cache);
  };
  // The slow worker first: the last stage's head would tip a cut either way.
  testing::Cluster cluster({.workers = 2, .emulated_speeds = {0.5, 1.0}});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  for (const bool per_worker : {true, false}) {
    SCOPED_TRACE(per_worker ? "per-worker profiles" : "one profile");
    const std::string yaml = absl::StrCat(R"(name: hetero
model: {name: emulated, depth: 8, forward_ms: 4, backward_ms: 8}
data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [2, 4, 4]}
algorithm: backprop
stages: {count: 2, partition: auto}
placement: {per_worker_profiles: )",
                                          per_worker ? "true" : "false", R"(}
batch_size: 16
steps: 2
)");
    auto id = cluster.manager().Submit(yaml);
    ASSERT_TRUE(id.ok()) << id.status();
    auto st = cluster.WaitForJob(*id);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
    EXPECT_EQ(st->summary().count("plan.worker_profiles"), per_worker ? 1u : 0u);
    // Blocks per worker (stage j on worker j): worker 0 is the slow one.
    std::vector<int> blocks;
    for (auto& w : cluster.workers()) {
      auto rt = w->runtime();
      ASSERT_NE(rt, nullptr);
      ASSERT_EQ(rt->job_id(), *id);
      blocks.push_back(static_cast<int>(rt->model().blocks().size()));
    }
    std::string plan;  // for the failure messages
    for (const auto& [key, value] : st->summary()) {
      if (absl::StartsWith(key, "plan.stage")) absl::StrAppend(&plan, " ", key, "=", value);
    }
    SCOPED_TRACE(plan);
    ASSERT_EQ(blocks[0] + blocks[1], 9);  // 8 emulated blocks and the head
    if (per_worker) {
      // Twice as slow: about a third of the model (3 of 9), not half.
      EXPECT_LE(blocks[0] + 2, blocks[1]) << blocks[0] << " / " << blocks[1];
    } else {
      EXPECT_LE(std::abs(blocks[0] - blocks[1]), 1) << blocks[0] << " / " << blocks[1];
    }
  }
}

// placement.labels: a job runs only on workers started with its labels
// (--label), and waits, saying so, while too few of them are idle.
TEST(Distributed, LabelledJobsRunOnlyOnWorkersWithTheLabels) {
  testing::Cluster cluster({.workers = 3, .labels = {{}, {{"gpu", "h100"}}, {{"gpu", "a100"}}}});
  ASSERT_TRUE(cluster.WaitForWorkers(3));
  auto yaml = [](int stages) {
    return absl::StrCat(R"(name: labelled
model: {name: mlp, hidden: [8]}
data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [1, 2, 2], classes: 2}
stages: )",
                        stages, R"(
placement: {labels: [gpu=a100]}
batch_size: 16
steps: 2
)");
  };
  auto id = cluster.manager().Submit(yaml(1));
  ASSERT_TRUE(id.ok()) << id.status();
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  for (size_t i = 0; i < cluster.workers().size(); ++i) {
    auto rt = cluster.workers()[i]->runtime();
    EXPECT_EQ(rt != nullptr && rt->job_id() == *id, i == 2) << "worker " << i;
  }
  // Two stages need two a100 workers: there is one.
  auto waiting = cluster.manager().Submit(yaml(2));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  bool said = false;
  for (int i = 0; i < 100 && !said; ++i) {
    auto job = cluster.manager().GetJob(*waiting);
    said = job.ok() && absl::StrContains(job->reason(), "labelled gpu=a100") &&
           absl::StrContains(job->reason(), "1 of them idle");
    if (!said) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(said);
  ASSERT_TRUE(cluster.manager().Cancel(*waiting, "test over").ok());
}

// A job on `device: cuda` goes only to workers on a CUDA device: on CPU
// workers it waits, and says so.
TEST(Distributed, AGpuJobWaitsForWorkersWithAGpu) {
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(R"(name: on-gpu
device: cuda
model: {name: mlp, hidden: [8]}
data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [1, 2, 2], classes: 2}
stages: 2
batch_size: 16
steps: 2
)");
  ASSERT_TRUE(id.ok()) << id.status();
  bool said = false;
  for (int i = 0; i < 100 && !said; ++i) {
    auto job = cluster.manager().GetJob(*id);
    said = job.ok() && job->state() == v1::PENDING &&
           absl::StrContains(job->reason(), "labelled device=cuda") &&
           absl::StrContains(job->reason(), "0 of them idle, 2 idle");
    if (!said) absl::SleepFor(absl::Milliseconds(50));
  }
  auto job = cluster.manager().GetJob(*id);
  EXPECT_TRUE(said) << (job.ok() ? job->reason() : job.status().ToString());
  for (auto& w : cluster.workers()) EXPECT_EQ(w->runtime(), nullptr);
  ASSERT_TRUE(cluster.manager().Cancel(*id, "test over").ok());
}

TEST(Distributed, JobWaitsForWorkersThenCanBeCancelled) {
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(Job(3, 5));
  ASSERT_TRUE(id.ok()) << id.status();
  absl::SleepFor(absl::Milliseconds(200));
  auto st = cluster.manager().GetJob(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::PENDING);
  EXPECT_NE(st->reason().find("waiting for 3 idle workers (2 idle, 2 registered)"),
            std::string::npos)
      << st->reason();

  // A third worker arrives: the job runs.
  cluster.AddWorker();
  auto done = cluster.WaitForJob(*id);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();

  auto pending = cluster.manager().Submit(Job(4, 5));
  ASSERT_TRUE(pending.ok());
  auto cancelled = cluster.manager().Cancel(*pending, "changed my mind");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->reason(), "changed my mind");
}

// The worker's control stream is read while a stage builds: the reader only
// hands commands on (the stage thread builds, starts, stops and joins). Proof:
// while every stage's build is held, the workers keep taking the clock replies
// to their heartbeats, which the stream delivers between commands; once the
// builds go on, the job runs to the end on its first attempt.
TEST(Distributed, TheControlStreamIsReadWhileAStageBuilds) {
  absl::Mutex mu;
  int building = 0;
  bool release = false;
  testing::Cluster::Options options{.workers = 2};
  options.before_stage_build = [&](const v1::StageAssignment&) {
    absl::MutexLock lock(&mu);
    ++building;
    mu.Await(absl::Condition(&release));
  };
  testing::Cluster cluster(options);
  // Destroyed before the cluster: a failed assertion below must not leave the
  // stage threads held in their builds while the cluster shuts down.
  auto unblock = absl::MakeCleanup([&] {
    absl::MutexLock lock(&mu);
    release = true;
  });
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(Job(2, 4));
  ASSERT_TRUE(id.ok()) << id.status();
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n == 2; }, &building),
                                    absl::Seconds(30)));
  }
  // Both stage threads are held inside their builds now.
  std::vector<int64_t> before;
  for (auto& w : cluster.workers()) before.push_back(w->clock_samples());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool all_advanced = false;
  while (!all_advanced && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    all_advanced = true;
    for (size_t i = 0; i < before.size(); ++i) {
      all_advanced = all_advanced && cluster.workers()[i]->clock_samples() >= before[i] + 2;
    }
  }
  EXPECT_TRUE(all_advanced) << "the control streams were not read while the stages built";
  EXPECT_EQ(cluster.manager().GetJob(*id)->state(), v1::CONFIGURING);
  std::move(unblock).Invoke();
  auto done = cluster.WaitForJob(*id);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  EXPECT_EQ(done->attempt(), 0);
}

// A diverged loss fails the job naming the cause; it is not retried (a
// recovery would replay the same trajectory) and the workers take the next job.
TEST(Distributed, ADivergedLossFailsTheJobAndIsNotRetried) {
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(R"(name: diverges
seed: 1
model: {name: mlp, hidden: [32]}
data: {dataset: synthetic, train_size: 256, test_size: 64, shape: [1, 8, 8], classes: 4}
stages: 2
optimizer: {lr: 1.0e+30}
batch_size: 16
steps: 200
)");
  ASSERT_TRUE(id.ok()) << id.status();
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->state(), v1::FAILED);
  EXPECT_NE(st->reason().find("training diverged"), std::string::npos) << st->reason();
  EXPECT_LE(st->attempts_size(), 1) << "a diverged job was retried";
  ExpectTwoWorkersRunAnotherJob(cluster, 3);
}

TEST(Distributed, CancellingARunningJobStopsItsStages) {
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(Job(2, 1000000));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(cluster.WaitForState(*id, v1::RUNNING));
  auto st = cluster.manager().Cancel(*id, "");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::CANCELLED);
  // The workers become idle again and run another job.
  ExpectTwoWorkersRunAnotherJob(cluster, 3);
}

TEST(Distributed, InvalidSpecsAreRefusedNamingTheKey) {
  testing::Cluster cluster({.workers = 0});
  auto bad = cluster.manager().Submit(Job(2, 5, "optimiser: {lr: 1}\n"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("optimiser"), std::string::npos);
  auto too_many = cluster.manager().Submit(Job(9, 5));
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("stages.count"), std::string::npos)
      << too_many.status();
  // Every algorithm the job spec knows is available on the coordinator.
  for (const std::string& name : KnownAlgorithms()) {
    auto job = cluster.manager().Submit(Job(1, 5, absl::StrCat("algorithm: ", name, "\n")));
    EXPECT_NE(job.status().code(), absl::StatusCode::kUnimplemented) << name << job.status();
  }
}

TEST(Distributed, MetricsEndpointsServeTheDocumentedFamilies) {
  testing::Cluster cluster({.workers = 2, .metrics_endpoints = true});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(Job(2, 8));
  ASSERT_TRUE(id.ok());
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();

  auto coord = metrics::Scrape("127.0.0.1", cluster.coordinator_metrics_port());
  ASSERT_TRUE(coord.ok()) << coord.status();
  for (const char* name :
       {"stagewise_job_train_loss", "stagewise_job_samples_per_second", "stagewise_job_step",
        "stagewise_job_eval_accuracy", "stagewise_coordinator_workers"}) {
    EXPECT_TRUE(metrics::FindSample(*coord, name, {{"job", *id}}).ok() ||
                metrics::FindSample(*coord, name).ok())
        << name << "\n"
        << *coord;
  }
  auto step = metrics::FindSample(*coord, "stagewise_job_step", {{"job", *id}});
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(*step, 8);

  // A stage's series live while the stage runs and go when it ends.
  auto running = cluster.manager().Submit(Job(2, 100000));
  ASSERT_TRUE(running.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    auto now = cluster.manager().GetJob(*running);
    ASSERT_TRUE(now.ok());
    if (now->step() >= 3) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (auto& w : cluster.workers()) {
    auto text = metrics::Scrape("127.0.0.1", w->metrics_port());
    ASSERT_TRUE(text.ok()) << text.status();
    const std::string stage = std::to_string(w->runtime()->stage());
    for (const char* name : {"stagewise_stage_compute_seconds_count",
                             "stagewise_stage_idle_seconds_total", "stagewise_stage_inbox_depth",
                             "stagewise_transport_bytes_total", "stagewise_stage_staleness_steps",
                             "stagewise_stage_memory_bytes", "stagewise_stage_steps_total"}) {
      EXPECT_TRUE(metrics::FindSample(*text, name, {{"job", *running}, {"stage", stage}}).ok())
          << name << "\n"
          << *text;
    }
    auto steps = metrics::FindSample(*text, "stagewise_stage_steps_total", {{"job", *running}});
    ASSERT_TRUE(steps.ok());
    EXPECT_GT(*steps, 0);
    auto sent = metrics::FindSample(*text, "stagewise_transport_bytes_total",
                                    {{"job", *running}, {"direction", "sent"}});
    ASSERT_TRUE(sent.ok());
    EXPECT_GT(*sent, 0);
    auto received = metrics::FindSample(*text, "stagewise_transport_bytes_total",
                                        {{"job", *running}, {"direction", "received"}});
    ASSERT_TRUE(received.ok());
    EXPECT_GT(*received, 0);
  }
  ASSERT_TRUE(cluster.manager().Cancel(*running, "enough").ok());
  auto cancelled = cluster.WaitForJob(*running);
  ASSERT_TRUE(cancelled.ok());
  for (auto& w : cluster.workers()) {
    // The stage retires its series as it ends (after the coordinator's Stop).
    bool gone = false;
    std::string text;
    for (const absl::Time until = absl::Now() + absl::Seconds(30); !gone && absl::Now() < until;) {
      auto scraped = metrics::Scrape("127.0.0.1", w->metrics_port());
      ASSERT_TRUE(scraped.ok()) << scraped.status();
      text = *scraped;
      gone = !metrics::FindSample(text, "stagewise_stage_steps_total", {{"job", *running}}).ok();
      if (!gone) absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_TRUE(gone) << "a finished stage still exports its series\n" << text;
  }
}

TEST(Distributed, JobHistorySurvivesACoordinatorRestart) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("stagewise_restart_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  testing::Cluster cluster({.workers = 1, .db = (dir / "coordinator.db").string()});
  ASSERT_TRUE(cluster.WaitForWorkers(1));
  auto id = cluster.manager().Submit(Job(1, 6));
  ASSERT_TRUE(id.ok());
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->state(), v1::SUCCEEDED);

  cluster.StopCoordinator();
  cluster.StartCoordinator();
  auto again = cluster.manager().GetJob(*id);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::SUCCEEDED);
  EXPECT_EQ(again->step(), 6);
  EXPECT_DOUBLE_EQ(again->eval_accuracy(), st->eval_accuracy());
  auto jobs = cluster.manager().ListJobs(10);
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  // The worker reconnects to the restarted coordinator and takes new work.
  ASSERT_TRUE(cluster.WaitForWorkers(1));
  auto next = cluster.manager().Submit(Job(1, 2));
  ASSERT_TRUE(next.ok());
  auto done = cluster.WaitForJob(*next);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stagewise
