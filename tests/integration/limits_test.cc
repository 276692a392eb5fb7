// Limits against the real binaries (docs/security.md, "Limits"): the paths a
// job spec names stay under the operator's roots; a worker refuses stage
// streams beyond --max-streams; a stalled consumer cannot grow a worker's
// memory without bound (the bounded inbox and outbox push back on the
// sender through gRPC flow control); a garbled message on a bound stream
// fails its job, not the worker.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/rpc/server.h"
#include "services/tensor/codec.h"
#include "stagewise/v1/stage.grpc.pb.h"
#include "tests/integration/fake_worker.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

namespace fs = std::filesystem;
using testing::FakeWorker;
using testing::ProcessCluster;

constexpr char kJob[] = R"(name: limits
model: {name: mlp, hidden: [32, 32]}
data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 8, 8], classes: 4}
batch_size: 16
stages: 1
recovery: {max_restarts: 0}
)";

using Options = ProcessCluster::Options;

TEST(Paths, ACheckpointDirOutsideTheRootIsRefusedAtSubmitNamingTheKey) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const fs::path outside =
      fs::path(cluster.dir()).parent_path() / absl::StrCat("stagewise_outside_", ::getpid());
  for (const std::string& dir :
       {outside.string(), cluster.dir() + "/ckpt/../../" + outside.filename().string(),
        std::string("/etc/stagewise")}) {
    auto id = cluster.client().Submit(
        absl::StrCat(kJob, "steps: 4\ncheckpoint: {dir: '", dir, "', every_steps: 2}\n"));
    ASSERT_FALSE(id.ok()) << dir;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
    EXPECT_NE(id.status().message().find("checkpoint.dir"), std::string::npos) << id.status();
  }
  EXPECT_FALSE(fs::exists(outside)) << "the coordinator created a directory outside its root";
  // A symlink inside the root that leads out of it.
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, fs::path(cluster.dir()) / "escape");
  auto via_link = cluster.client().Submit(absl::StrCat(
      kJob, "steps: 4\ncheckpoint: {dir: '", cluster.dir(), "/escape/ckpt', every_steps: 2}\n"));
  EXPECT_EQ(via_link.status().code(), absl::StatusCode::kInvalidArgument) << via_link.status();
  EXPECT_FALSE(fs::exists(outside / "ckpt"));
  fs::remove_all(outside);
  // Inside the root: accepted, and the job checkpoints and succeeds.
  cluster.ExpectRunsToSuccess(absl::StrCat(kJob, "steps: 4\ncheckpoint: {dir: '", cluster.dir(),
                                           "/ckpt', every_steps: 2}\n"),
                              absl::Seconds(120));
  EXPECT_TRUE(fs::exists(fs::path(cluster.dir()) / "ckpt") &&
              !fs::is_empty(fs::path(cluster.dir()) / "ckpt"));
}

TEST(Paths, ADataPathOutsideTheWorkersRootFailsTheJobNamingTheKey) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(
      "name: escape\nmodel: {name: mlp, hidden: [8]}\n"
      "data: {dataset: fashion_mnist, path: /etc}\nbatch_size: 16\nsteps: 2\n"
      "recovery: {max_restarts: 0}\n");
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster.WaitForEnd(*id, absl::Seconds(60));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED);
  EXPECT_NE(end->reason().find("data.path"), std::string::npos) << end->reason();
  EXPECT_NE(end->reason().find("--data-root"), std::string::npos) << end->reason();
  // The worker is fine and takes the next job.
  cluster.ExpectRunsToSuccess(absl::StrCat(kJob, "steps: 2\n"), absl::Seconds(60));
}

TEST(Limits, StageStreamsBeyondMaxStreamsAreRefused) {
  constexpr int kMax = 4;
  ProcessCluster cluster(Options::OneWorker({"--max-streams", absl::StrCat(kMax)}));
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto stub = v1::StageService::NewStub(rpc::MakeChannel(
      absl::StrCat("127.0.0.1:", cluster.worker_port(0)), cluster.RpcOptionsFor("worker")));
  // Streams that never say anything hold their slots.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::StageMessage, v1::StageMessage>>>
      streams;
  for (int i = 0; i < kMax; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub->Exchange(contexts.back().get()));
  }
  absl::SleepFor(absl::Milliseconds(500));  // let the worker take them all
  grpc::ClientContext extra_ctx;
  extra_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto extra = stub->Exchange(&extra_ctx);
  v1::StageMessage ignored;
  EXPECT_FALSE(extra->Read(&ignored));
  grpc::Status refused = extra->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("--max-streams"), std::string::npos);
  // Closing them gives the slots back: the worker trains a 1-stage job and a
  // new stream is served (a garbled one is answered, not refused).
  for (auto& c : contexts) c->TryCancel();
  for (auto& s : streams) (void)s->Finish();
  cluster.ExpectRunsToSuccess(absl::StrCat(kJob, "steps: 2\n"), absl::Seconds(60));
  grpc::ClientContext again_ctx;
  again_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto again = stub->Exchange(&again_ctx);
  again->WritesDone();
  grpc::Status answered = again->Finish();
  EXPECT_EQ(answered.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << answered.error_message();
}

// Resident memory of a process, in bytes (VmRSS).
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

// The real worker runs the last stage; a fake stage 0 sends it activations
// as fast as it can and never reads the gradients that come back. The
// worker's outbox fills, its compute thread blocks, its inbox fills, and
// flow control stops the sender: the worker's memory stays bounded while the
// sender offers many times that bound.
TEST(Limits, AStalledConsumerCannotGrowTheProducersMemory) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  FakeWorker fake(cluster, "a-stage0");  // sorts before w0: it gets stage 0
  ASSERT_TRUE(fake.Register().ok());
  fake.Open("-", /*ack_configures=*/true);
  fake.KeepAlive();
  constexpr int64_t kBatch = 256, kWidth = 1024;  // 1 MiB of activations per message
  auto id = cluster.client().Submit(absl::StrCat(
      "name: stall\nmodel: {name: mlp, hidden: [", kWidth, ", ", kWidth,
      "]}\ndata: {dataset: synthetic, train_size: 200000, test_size: 256, shape: [1, 32, 32], "
      "classes: 10}\nalgorithm: {name: backprop, micro_batches: 1}\nbatch_size: ",
      kBatch,
      "\nstages: 2\nsteps: 100000\neval: {every_epochs: 0, at_end: false}\n"
      "recovery: {max_restarts: 0}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitFor(
      *id, [](const v1::JobStatus& s) { return s.state() == v1::RUNNING; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  const std::vector<v1::StageAssignment> assigned = fake.assignments();
  ASSERT_FALSE(assigned.empty());
  const v1::StageAssignment a = assigned.back();
  ASSERT_EQ(a.stage(), 0);

  const pid_t worker = cluster.worker_pid(0);
  const int64_t before = ResidentBytes(worker);
  ASSERT_GT(before, 0);
  constexpr int kOffered = 600;  // 600 MiB of activations, as many of gradients back
  auto stub = v1::StageService::NewStub(
      rpc::MakeChannel(a.next_address(), cluster.RpcOptionsFor("worker")));
  grpc::ClientContext ctx;
  auto stream = stub->Exchange(&ctx);
  std::atomic<int> written{0};
  std::thread sender([&] {
    torch::manual_seed(1);
    v1::StageMessage m;
    m.set_job_id(a.job_id());
    m.set_attempt(a.attempt());
    m.set_kind(v1::StageMessage::FORWARD);
    ASSERT_TRUE(EncodeTensor(torch::randn({kBatch, kWidth}), &(*m.mutable_tensors())["x"]).ok());
    ASSERT_TRUE(EncodeTensor(torch::randint(10, {kBatch}), &(*m.mutable_tensors())["labels"]).ok());
    v1::StageMessage open;  // a stage opens its stream with OPEN
    open.set_job_id(a.job_id());
    open.set_attempt(a.attempt());
    open.set_kind(v1::StageMessage::OPEN);
    if (!stream->Write(open)) return;
    for (int i = 0; i < kOffered; ++i) {
      m.set_step(i);
      if (!stream->Write(m)) return;
      ++written;
    }
  });
  int64_t peak = before;
  for (int i = 0; i < 60; ++i) {  // 15 s of samples
    absl::SleepFor(absl::Milliseconds(250));
    peak = std::max(peak, ResidentBytes(worker));
  }
  const int sent = written.load();
  auto status = cluster.client().GetJob(*id);
  ctx.TryCancel();
  sender.join();
  (void)stream->Finish();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::RUNNING) << status->reason() << "\n" << cluster.WorkerLog(0);
  // The sender was held back well before its 600 messages ...
  EXPECT_LT(sent, kOffered) << "nothing pushed back on the sender";
  // ... and the worker holds a bounded number of them (inbox 64, outbox 16,
  // flow-control windows), far below what the sender offered.
  const int64_t growth = peak - before;
  std::cout << "[ stalled ] sender wrote " << sent << " of " << kOffered
            << " messages of 1 MiB; worker RSS " << before / (1 << 20) << " MiB -> peak "
            << peak / (1 << 20) << " MiB\n";
#if defined(__SANITIZE_ADDRESS__)
  constexpr int64_t kBound = int64_t{600} << 20;  // redzones and quarantine (scripts/test)
#else
  constexpr int64_t kBound = int64_t{300} << 20;
#endif
  EXPECT_LT(growth, kBound) << "worker RSS grew by " << growth / (1 << 20) << " MiB";
  auto workers = cluster.client().ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->size(), 2u);
}

// A stream that was bound by a good first message, then carries a message
// whose tensor lies about its size (a shape of 256 x 1024 floats over 10
// bytes of data): the worker refuses it before decoding, fails that job with
// a reason that names the problem, and stays up and registered.
TEST(Limits, AGarbledMessageOnABoundStreamFailsTheJobAndNotTheWorker) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  FakeWorker fake(cluster, "a-stage0");  // sorts before w0: it gets stage 0
  ASSERT_TRUE(fake.Register().ok());
  fake.Open("-", /*ack_configures=*/true);
  fake.KeepAlive();
  constexpr int64_t kBatch = 16, kWidth = 64;
  auto id = cluster.client().Submit(absl::StrCat(
      "name: garbled\nmodel: {name: mlp, hidden: [", kWidth, ", ", kWidth,
      "]}\ndata: {dataset: synthetic, train_size: 100000, test_size: 32, shape: [1, 8, 8], "
      "classes: 4}\nalgorithm: {name: backprop, micro_batches: 1}\nbatch_size: ",
      kBatch, "\nstages: 2\nsteps: 1000\nrecovery: {max_restarts: 0}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto running = cluster.WaitFor(
      *id, [](const v1::JobStatus& s) { return s.state() == v1::RUNNING; }, absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->state(), v1::RUNNING) << running->reason();
  const std::vector<v1::StageAssignment> assigned = fake.assignments();
  ASSERT_FALSE(assigned.empty());
  const v1::StageAssignment a = assigned.back();
  ASSERT_EQ(a.stage(), 0);

  auto stub = v1::StageService::NewStub(
      rpc::MakeChannel(a.next_address(), cluster.RpcOptionsFor("worker")));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->Exchange(&ctx);
  v1::StageMessage good;
  good.set_job_id(a.job_id());
  good.set_attempt(a.attempt());
  good.set_kind(v1::StageMessage::FORWARD);
  good.set_step(0);
  torch::manual_seed(1);
  // The activations of stage 0: the first hidden layer's output.
  ASSERT_TRUE(EncodeTensor(torch::randn({kBatch, kWidth}), &(*good.mutable_tensors())["x"]).ok());
  ASSERT_TRUE(EncodeTensor(torch::randint(4, {kBatch}), &(*good.mutable_tensors())["labels"]).ok());
  v1::StageMessage open;  // a stage opens its stream with OPEN
  open.set_job_id(a.job_id());
  open.set_attempt(a.attempt());
  open.set_kind(v1::StageMessage::OPEN);
  ASSERT_TRUE(stream->Write(open));
  ASSERT_TRUE(stream->Write(good));
  // The worker answers the good message with its gradient: the stream is bound.
  v1::StageMessage reply;
  ASSERT_TRUE(stream->Read(&reply)) << cluster.WorkerLog(0);
  EXPECT_EQ(reply.kind(), v1::StageMessage::BACKWARD);

  v1::StageMessage bad = good;
  bad.set_step(1);
  v1::TensorProto& x = (*bad.mutable_tensors())["x"];
  x.clear_shape();
  x.add_shape(256);
  x.add_shape(1024);
  x.set_data(std::string(10, '\x7f'));
  (void)stream->Write(bad);
  auto ended = cluster.WaitFor(
      *id, [](const v1::JobStatus& s) { return s.state() == v1::FAILED; }, absl::Seconds(60));
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::FAILED) << ended->reason();
  EXPECT_NE(ended->reason().find("bytes"), std::string::npos) << ended->reason();
  ctx.TryCancel();
  (void)stream->Finish();

  // The worker process is alive, still registered, and serves new streams.
  const pid_t worker = cluster.worker_pid(0);
  ASSERT_GT(worker, 0);
  EXPECT_EQ(::kill(worker, 0), 0) << cluster.WorkerLog(0);
  auto workers = cluster.client().ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->size(), 2u);
  grpc::ClientContext again_ctx;
  again_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto again = stub->Exchange(&again_ctx);
  again->WritesDone();
  grpc::Status answered = again->Finish();
  EXPECT_EQ(answered.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << answered.error_message();
}

}  // namespace
}  // namespace stagewise
