// An in-process stagewise cluster for tests: a real coordinator service and J
// real workers, all gRPC on 127.0.0.1 port 0.
#ifndef STAGEWISE_TESTS_INTEGRATION_CLUSTER_H_
#define STAGEWISE_TESTS_INTEGRATION_CLUSTER_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_manager.h"
#include "coordinator/store.h"
#include "services/metrics/metrics.h"
#include "worker/worker.h"

namespace stagewise::testing {

// For tests on a GPU (STAGEWISE_TEST_DEVICE=cuda:N): cuDNN without TF32,
// deterministic algorithms, so that a pipeline and its single-process
// reference compute bit-comparable results. Process-wide; idempotent.
void UseExactCudaMath();

class Cluster {
 public:
  struct Options {
    int workers = 2;
    std::string db = ":memory:";
    bool metrics_endpoints = false;  // serve /metrics on 127.0.0.1:0
    // Every worker's WorkerOptions::before_stage_build.
    std::function<void(const v1::StageAssignment&)> before_stage_build = nullptr;
    // Worker i's WorkerOptions::emulated_speed (1 where not given).
    std::vector<double> emulated_speeds = {};
    // Worker i's WorkerOptions::emulated_speed_file (none where not given):
    // a file the worker re-reads every 250 ms, to change its speed mid-job.
    std::vector<std::string> emulated_speed_files = {};
    // Worker i's WorkerOptions::labels (none where not given).
    std::vector<std::map<std::string, std::string>> labels = {};
    // Every worker's WorkerOptions::shared_memory_dir (empty: same-host
    // payloads off, every payload inline on the stream).
    std::string shared_memory_dir = "/dev/shm";
    bool place_outputs = true;  // WorkerOptions::place_outputs
    // Every worker's emulated one-way link latency (worker
    // --emulate-link-delay-ms; 0: none).
    double link_delay_ms = 0;
    // The coordinator's --scheduling-config (none: FIFO with backfill).
    std::optional<SharingConfig> sharing = std::nullopt;
  };
  explicit Cluster(Options options);
  ~Cluster();

  // Starts the coordinator (again, after StopCoordinator) on the same db.
  void StartCoordinator();
  void StopCoordinator();
  void AddWorker();

  coordinator::JobManager& manager() { return *manager_; }
  std::string coordinator_address() const { return "127.0.0.1:" + std::to_string(port_); }
  int coordinator_metrics_port() const { return metrics_->port(); }
  std::vector<std::unique_ptr<worker::Worker>>& workers() { return workers_; }

  // Waits until `n` workers are connected and idle.
  bool WaitForWorkers(int n, absl::Duration timeout = absl::Seconds(30));
  // Polls until the job reaches a terminal state; returns its status.
  absl::StatusOr<v1::JobStatus> WaitForJob(const std::string& job_id,
                                           absl::Duration timeout = absl::Seconds(120));
  bool WaitForState(const std::string& job_id, v1::JobState state,
                    absl::Duration timeout = absl::Seconds(60));
  // Parameters and buffers of every stage of the last job, by global name.
  std::map<std::string, torch::Tensor> StageTensors(const std::string& job_id, bool buffers);

 private:
  Options options_;
  std::unique_ptr<coordinator::JobStore> store_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  std::unique_ptr<metrics::CoordinatorMetrics> coordinator_metrics_;
  std::unique_ptr<coordinator::JobManager> manager_;
  std::unique_ptr<coordinator::CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::vector<std::unique_ptr<worker::Worker>> workers_;
};

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_INTEGRATION_CLUSTER_H_
