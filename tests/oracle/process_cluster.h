// A stagewise cluster of real processes for fault-tolerance tests: one
// `stagewise-coordinator` (SQLite file) and J `stagewise-worker`s on
// 127.0.0.1, each a child the test can SIGKILL and start again with the same
// arguments. Logs and the database live in a temporary directory removed by
// the destructor (unless STAGEWISE_KEEP_TEST_DIRS is set).
#ifndef STAGEWISE_TESTS_ORACLE_PROCESS_CLUSTER_H_
#define STAGEWISE_TESTS_ORACLE_PROCESS_CLUSTER_H_

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/cli/process.h"
#include "clients/client/coordinator_client.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::testing {

class ProcessCluster {
 public:
  struct Options {
    int workers = 2;
    double heartbeat_timeout_s = 5;
    // Extra stagewise-coordinator flags (e.g. {"--configure-timeout", "2"}).
    std::vector<std::string> coordinator_args;
    // Extra stagewise-worker flags (e.g. {"--max-streams", "4"}); "{i}" in
    // one becomes the worker's index.
    std::vector<std::string> worker_args;
    // Serve /metrics on 127.0.0.1 (coordinator_metrics_port, worker_metrics_port).
    bool metrics = false;
    // Mutual TLS between every process, with throw-away certificates made in
    // dir()/tls (CreateLocalPki: identities coordinator, worker, client; and
    // worker-<i> for worker i); false: --insecure.
    bool tls = true;
    // --tls-reload-seconds of every process and of RpcOptionsFor's channels
    // (0: the default).
    int tls_reload_seconds = 0;
    // Contents of a --tokens file for the coordinator ("" = no tokens).
    std::string tokens;
    // The bearer token of client() ("" = none).
    std::string client_token;

    // One worker that is declared lost 3 s after its heartbeats stop (the
    // hostile and limits tests).
    static Options OneWorker(std::vector<std::string> worker_args = {}) {
      Options o;
      o.workers = 1;
      o.heartbeat_timeout_s = 3;
      o.worker_args = std::move(worker_args);
      return o;
    }
  };
  // Starts the coordinator and the workers and waits until they are
  // registered. Check ok() (and error()) before use.
  explicit ProcessCluster(Options options);
  explicit ProcessCluster(int workers, double heartbeat_timeout_s = 5);
  ~ProcessCluster();

  bool ok() const { return error_.ok(); }
  const absl::Status& error() const { return error_; }
  const std::string& dir() const { return dir_; }  // temporary directory of this cluster
  ::stagewise::client::CoordinatorClient& client() { return *client_; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  std::string coordinator_address() const;
  int coordinator_metrics_port() const { return coordinator_metrics_port_; }
  int worker_port(int i) const { return worker_ports_[i].grpc; }
  int worker_metrics_port(int i) const { return worker_ports_[i].metrics; }
  // The process id of worker i (0 when it is not running).
  pid_t worker_pid(int i) const { return workers_[i] ? workers_[i]->pid() : 0; }
  pid_t coordinator_pid() const { return coordinator_ ? coordinator_->pid() : 0; }
  // Channel settings of a process with certificate `identity` (coordinator,
  // worker or client; plaintext when TLS is off).
  rpc::RpcOptions RpcOptionsFor(const std::string& identity) const;
  std::string pki_dir() const { return dir_ + "/tls"; }

  // SIGKILL, then the same command line again (the same name, so it registers
  // as the same worker). Returns once it answers on its port again.
  absl::Status KillAndRestartWorker(int i);
  absl::Status KillWorker(int i);
  // SIGTERM (once) and up to `wait` for worker i to exit by itself (then
  // SIGKILL and an error). How it ended ("exited with code 0").
  absl::StatusOr<std::string> TerminateWorker(int i, absl::Duration wait);
  absl::Status StartWorker(int i);
  // Starts them all, then waits for each (they register close together).
  absl::Status StartWorkers(const std::vector<int>& which);
  // SIGKILL of the coordinator, then (after `down_for`) the same command line
  // (same port, same db). Returns once it serves again.
  absl::Status KillAndRestartCoordinator(absl::Duration down_for = absl::ZeroDuration());

  // Waits until `n` workers are registered (ListWorkers).
  absl::Status WaitForWorkers(int n, absl::Duration timeout = absl::Seconds(60));
  // Polls the job (through coordinator restarts) until `done(status)` or a
  // terminal state; returns the last status.
  absl::StatusOr<v1::JobStatus> WaitFor(const std::string& job_id,
                                        const std::function<bool(const v1::JobStatus&)>& done,
                                        absl::Duration timeout = absl::Seconds(300));
  absl::StatusOr<v1::JobStatus> WaitForEnd(const std::string& job_id,
                                           absl::Duration timeout = absl::Seconds(300));
  // Submits `job_spec_yaml` and waits for its end; a test failure (not an
  // error status) when it does not succeed. For "the cluster still serves".
  void ExpectRunsToSuccess(const std::string& job_spec_yaml,
                           absl::Duration timeout = absl::Seconds(120));
  // The log of worker i / of the coordinator (for failure messages).
  std::string WorkerLog(int i) const;
  std::string CoordinatorLog() const;

 private:
  absl::Status StartCoordinator();
  std::vector<std::string> TlsFlags(const std::string& identity) const;

  absl::Status error_;
  std::string dir_;
  std::string bin_;
  int coordinator_port_ = 0;
  Options options_;
  int coordinator_metrics_port_ = 0;
  std::vector<std::string> worker_port_files_;
  std::vector<cli::Ports> worker_ports_;
  std::unique_ptr<cli::Child> coordinator_;
  std::vector<std::vector<std::string>> worker_argv_;
  std::vector<std::unique_ptr<cli::Child>> workers_;
  std::unique_ptr<::stagewise::client::CoordinatorClient> client_;
};

// The parameters and buffers (by global name) of the committed checkpoint at
// `step` of a job, read from its shards (each loaded into its stage's model
// rebuilt from the manifest's spec). Errors name the file.
absl::StatusOr<std::map<std::string, torch::Tensor>> CheckpointTensors(
    const std::string& checkpoint_root, const std::string& job_id, int64_t step);

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_ORACLE_PROCESS_CLUSTER_H_
