#include "tests/integration/cluster.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "services/rpc/server.h"

namespace stagewise::testing {

void UseExactCudaMath() {
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

Cluster::Cluster(Options options) : options_(std::move(options)) {
  StartCoordinator();
  for (int i = 0; i < options_.workers; ++i) AddWorker();
}

Cluster::~Cluster() {
  for (auto& w : workers_) w->Shutdown();
  StopCoordinator();
}

void Cluster::StartCoordinator() {
  auto store = coordinator::JobStore::Open(options_.db);
  EXPECT_TRUE(store.ok()) << store.status();
  store_ = std::move(*store);
  auto metrics = metrics::MetricsServer::Start(options_.metrics_endpoints ? "127.0.0.1:0" : "");
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  metrics_ = std::move(*metrics);
  coordinator_metrics_ = std::make_unique<metrics::CoordinatorMetrics>(metrics_->registry());
  coordinator::JobManagerOptions mo;
  mo.heartbeat_interval = absl::Milliseconds(200);
  mo.heartbeat_timeout = absl::Seconds(5);
  mo.sharing = options_.sharing;
  manager_ =
      std::make_unique<coordinator::JobManager>(store_.get(), coordinator_metrics_.get(), mo);
  EXPECT_TRUE(manager_->Start().ok());
  service_ = std::make_unique<coordinator::CoordinatorService>(manager_.get());
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder({}, &builder);
  // Reuse the port across restarts so connected workers find us again.
  const std::string listen = "127.0.0.1:" + std::to_string(port_);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  EXPECT_TRUE(server_ != nullptr);
}

void Cluster::StopCoordinator() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  if (manager_) manager_->Stop();
  service_.reset();
  manager_.reset();
  coordinator_metrics_.reset();
  metrics_.reset();
  store_.reset();
}

void Cluster::AddWorker() {
  worker::WorkerOptions wo;
  wo.coordinator = coordinator_address();
  wo.listen = "127.0.0.1:0";
  wo.advertise = "127.0.0.1";
  wo.metrics_listen = options_.metrics_endpoints ? "127.0.0.1:0" : "";
  wo.name = "w" + std::to_string(workers_.size());
  wo.reconnect = absl::Milliseconds(200);
  wo.before_stage_build = options_.before_stage_build;
  wo.shared_memory_dir = options_.shared_memory_dir;
  wo.place_outputs = options_.place_outputs;
  wo.rpc.emulated_link_delay_ms = options_.link_delay_ms;
  if (workers_.size() < options_.labels.size()) wo.labels = options_.labels[workers_.size()];
  if (workers_.size() < options_.emulated_speeds.size()) {
    wo.emulated_speed = options_.emulated_speeds[workers_.size()];
  }
  if (workers_.size() < options_.emulated_speed_files.size()) {
    wo.emulated_speed_file = options_.emulated_speed_files[workers_.size()];
  }
  // STAGEWISE_TEST_DEVICE=cuda:0 runs the in-process workers on a GPU (the
  // oracles' reference trainers follow it, tests/oracle/oracle_util.h).
  if (const char* device = std::getenv("STAGEWISE_TEST_DEVICE");
      device != nullptr && *device != '\0') {
    wo.device = device;
    if (torch::Device(device).is_cuda()) UseExactCudaMath();
  }
  auto w = std::make_unique<worker::Worker>(wo);
  absl::Status s = w->Start();
  EXPECT_TRUE(s.ok()) << s;
  workers_.push_back(std::move(w));
}

bool Cluster::WaitForWorkers(int n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int idle = 0;
    for (const auto& info : manager_->ListWorkers()) {
      if (info.labels().count("state") && info.labels().at("state") == "idle") ++idle;
    }
    if (idle >= n) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

absl::StatusOr<v1::JobStatus> Cluster::WaitForJob(const std::string& job_id,
                                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    auto st = manager_->GetJob(job_id);
    if (!st.ok()) return st.status();
    if (coordinator::IsTerminal(st->state())) return *st;
    if (absl::Now() > deadline) return absl::DeadlineExceededError(st->DebugString());
    absl::SleepFor(absl::Milliseconds(20));
  }
}

bool Cluster::WaitForState(const std::string& job_id, v1::JobState state, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto st = manager_->GetJob(job_id);
    if (st.ok() && st->state() == state) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::map<std::string, torch::Tensor> Cluster::StageTensors(const std::string& job_id,
                                                           bool buffers) {
  std::map<std::string, torch::Tensor> out;
  for (auto& w : workers_) {
    for (const auto& rt : w->runtimes()) {  // interleaved: each of the worker's chunks
      if (rt->job_id() != job_id) continue;
      auto model = rt->model_ptr();
      if (buffers) {
        for (const auto& item : model->named_buffers()) {
          out[item.key()] = item.value().detach().cpu();
        }
      } else {
        for (const auto& item : model->named_parameters()) {
          out[item.key()] = item.value().detach().cpu();
        }
      }
    }
  }
  return out;
}

}  // namespace stagewise::testing
