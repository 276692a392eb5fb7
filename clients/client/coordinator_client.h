// A small C++ client of the Coordinator service, used by the CLI and tests.
// Unary calls carry deadlines; errors come back as absl::Status.
#ifndef STAGEWISE_CLIENTS_CLIENT_COORDINATOR_CLIENT_H_
#define STAGEWISE_CLIENTS_CLIENT_COORDINATOR_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagewise/v1/coordinator.grpc.pb.h"

namespace stagewise::client {

// Address resolution: the flag if set, else $STAGEWISE_COORDINATOR, else
// "127.0.0.1:7070".
std::string ResolveCoordinatorAddress(const std::string& flag_value);

class CoordinatorClient {
 public:
  explicit CoordinatorClient(const std::string& address,
                             absl::Duration deadline = absl::Seconds(10));

  absl::StatusOr<std::string> Submit(const std::string& job_spec_yaml);  // job id
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id);
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(int limit = 0);
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& job_id, const std::string& reason);
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();

  // Streams the job's events until the job reaches a terminal state (returns
  // its last status), `on_event` returns false, or the stream breaks (error).
  absl::StatusOr<v1::JobStatus> Watch(const std::string& job_id,
                                      const std::function<bool(const v1::JobEvent&)>& on_event);

  // Polls ListWorkers until at least `count` workers are registered.
  absl::Status WaitForWorkers(int count, absl::Duration timeout);

  const std::string& address() const { return address_; }

 private:
  std::string address_;
  absl::Duration deadline_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace stagewise::client

#endif  // STAGEWISE_CLIENTS_CLIENT_COORDINATOR_CLIENT_H_
