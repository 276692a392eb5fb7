// The real binaries as Kubernetes runs them: they come up without their
// peers, answer on their ports, and exit 0 promptly on SIGTERM.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <thread>

#include "clients/cli/process.h"
#include "clients/client/coordinator_client.h"
#include "services/rpc/server.h"
#include "stagewise/v1/stage.grpc.pb.h"

namespace stagewise {
namespace {
namespace fs = std::filesystem;

class Shutdown : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("stagewise_shutdown_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<cli::Child> Spawn(const std::string& binary, std::vector<std::string> args,
                                    const std::string& name) {
    args.insert(args.begin(), std::string(STAGEWISE_BINARY_DIR) + "/bin/" + binary);
    auto child = cli::Child::Spawn(args, (dir_ / (name + ".log")).string());
    EXPECT_TRUE(child.ok()) << child.status();
    return std::move(*child);
  }

  // Sends SIGTERM and expects exit code 0 within Kubernetes' default 30 s
  // grace period (20 s here: CI machines are loaded).
  void ExpectCleanExit(cli::Child& child) {
    const auto t0 = std::chrono::steady_clock::now();
    child.Signal(SIGTERM);
    while (child.IsRunning() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_FALSE(child.IsRunning()) << child.name() << " ignored SIGTERM\n"
                                    << cli::TailFile(child.log_path(), 20);
    auto status = child.ExitStatus();
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << child.name() << ": " << child.DescribeExit() << "\n"
        << cli::TailFile(child.log_path(), 20);
  }

  // Starts stagewise-coordinator on free ports; returns its gRPC address, or
  // "" (with a test failure) if it does not come up.
  std::string StartCoordinator() {
    coordinator_ = Spawn("stagewise-coordinator",
                         {"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--db",
                          (dir_ / "c.db").string(), "--port-file", (dir_ / "c.port").string()},
                         "coordinator");
    auto ports = cli::WaitForPortFile((dir_ / "c.port").string(), absl::Seconds(30), *coordinator_);
    EXPECT_TRUE(ports.ok()) << ports.status() << cli::TailFile(coordinator_->log_path(), 20);
    if (!ports.ok()) return "";
    coordinator_metrics_port_ = ports->metrics;
    return "127.0.0.1:" + std::to_string(ports->grpc);
  }

  // Starts stagewise-worker "w0" dialing `coordinator`; returns its gRPC port (0 on failure).
  int StartWorker(const std::string& coordinator) {
    worker_ = Spawn("stagewise-worker",
                    {"--coordinator", coordinator, "--listen", "127.0.0.1:0", "--advertise",
                     "127.0.0.1", "--metrics-listen", "", "--name", "w0", "--threads", "1",
                     "--port-file", (dir_ / "w.port").string()},
                    "worker");
    auto ports = cli::WaitForPortFile((dir_ / "w.port").string(), absl::Seconds(30), *worker_);
    EXPECT_TRUE(ports.ok()) << ports.status() << cli::TailFile(worker_->log_path(), 20);
    return ports.ok() ? ports->grpc : 0;
  }

  fs::path dir_;
  std::unique_ptr<cli::Child> coordinator_, worker_;
  int coordinator_metrics_port_ = 0;
};

TEST_F(Shutdown, CoordinatorAndWorkerExitZeroOnSigterm) {
  const std::string address = StartCoordinator();
  ASSERT_FALSE(address.empty());
  EXPECT_GT(coordinator_metrics_port_, 0);
  ASSERT_GT(StartWorker(address), 0);
  client::CoordinatorClient client(address);
  ASSERT_TRUE(client.WaitForWorkers(1, absl::Seconds(30)).ok());
  auto workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].worker_id(), "w0");

  ExpectCleanExit(*worker_);
  ExpectCleanExit(*coordinator_);
}

TEST_F(Shutdown, WorkerWaitsForItsCoordinatorAndStillStopsCleanly) {
  // Nothing listens on this port: the worker keeps dialing in the background.
  ASSERT_GT(StartWorker("127.0.0.1:1"), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_TRUE(worker_->IsRunning()) << cli::TailFile(worker_->log_path(), 20);
  ExpectCleanExit(*worker_);
}

// With recovery off (max_restarts: 0) a lost worker ends the job; recovery itself is covered
// by the recovery oracle and chaos tests.
TEST_F(Shutdown, WorkerStoppedMidJobExitsZeroAndTheJobFailsNamingIt) {
  const std::string address = StartCoordinator();
  ASSERT_FALSE(address.empty());
  ASSERT_GT(StartWorker(address), 0);
  client::CoordinatorClient client(address);
  ASSERT_TRUE(client.WaitForWorkers(1, absl::Seconds(30)).ok());
  auto id = client.Submit(R"(name: long
model: {name: mlp, hidden: [64]}
data: {dataset: synthetic, train_size: 512, test_size: 64, shape: [1, 8, 8], classes: 4}
batch_size: 16
steps: 100000000
recovery: {max_restarts: 0}
)");
  ASSERT_TRUE(id.ok()) << id.status();
  for (int i = 0; i < 500; ++i) {
    auto st = client.GetJob(*id);
    ASSERT_TRUE(st.ok());
    if (st->state() == v1::RUNNING && st->step() > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ExpectCleanExit(*worker_);
  v1::JobStatus st;
  for (int i = 0; i < 500; ++i) {
    auto got = client.GetJob(*id);
    ASSERT_TRUE(got.ok());
    st = *got;
    if (st.state() == v1::FAILED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st.state(), v1::FAILED);
  EXPECT_NE(st.reason().find("w0"), std::string::npos) << st.reason();
  ExpectCleanExit(*coordinator_);
}

TEST_F(Shutdown, WorkerProcessSurvivesAMalformedMessageAndServesTheNextJob) {
  const std::string address = StartCoordinator();
  ASSERT_FALSE(address.empty());
  const int worker_port = StartWorker(address);
  ASSERT_GT(worker_port, 0);
  client::CoordinatorClient client(address);
  ASSERT_TRUE(client.WaitForWorkers(1, absl::Seconds(30)).ok());
  const std::string job = R"(name: victim
model: {name: mlp, hidden: [64]}
data: {dataset: synthetic, train_size: 512, test_size: 64, shape: [1, 8, 8], classes: 4}
batch_size: 16
)";
  auto id = client.Submit(job + "steps: 100000000\n");
  ASSERT_TRUE(id.ok()) << id.status();
  for (int i = 0; i < 500; ++i) {
    auto st = client.GetJob(*id);
    if (st.ok() && st->state() == v1::RUNNING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto stub =
      v1::StageService::NewStub(rpc::MakeChannel("127.0.0.1:" + std::to_string(worker_port)));
  grpc::ClientContext ctx;
  auto stream = stub->Exchange(&ctx);
  v1::StageMessage bad;
  bad.set_job_id(*id);
  bad.set_kind(v1::StageMessage::FORWARD);
  auto& t = (*bad.mutable_tensors())["x"];
  t.set_dtype(static_cast<v1::DType>(42));
  t.add_shape(1);
  stream->Write(bad);
  stream->WritesDone();
  v1::StageMessage ignored;
  while (stream->Read(&ignored)) {
  }
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("dtype"), std::string::npos) << s.error_message();
  // Only that stream was refused: the job is still running; end it.
  auto still = client.GetJob(*id);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::RUNNING) << still->reason();
  ASSERT_TRUE(client.Cancel(*id, "enough").ok());
  auto cancelled = client.Watch(*id, [](const v1::JobEvent&) { return true; });
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);

  ASSERT_TRUE(worker_->IsRunning()) << cli::TailFile(worker_->log_path(), 20);
  auto next = client.Submit(job + "steps: 5\n");
  ASSERT_TRUE(next.ok());
  auto done = client.Watch(*next, [](const v1::JobEvent&) { return true; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->reason();
  ExpectCleanExit(*worker_);
  ExpectCleanExit(*coordinator_);
}

}  // namespace
}  // namespace stagewise
