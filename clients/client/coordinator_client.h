// A small C++ client of the Coordinator service, used by the CLI and tests.
// Unary calls carry deadlines; errors come back as absl::Status.
#ifndef STAGEWISE_CLIENTS_CLIENT_COORDINATOR_CLIENT_H_
#define STAGEWISE_CLIENTS_CLIENT_COORDINATOR_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagewise/v1/coordinator.grpc.pb.h"

namespace stagewise::client {

inline constexpr char kDefaultCoordinatorAddress[] = "127.0.0.1:7070";
inline constexpr char kCoordinatorEnvVar[] = "STAGEWISE_COORDINATOR";

// Address resolution: the flag if set, else $STAGEWISE_COORDINATOR, else
// "127.0.0.1:7070".
std::string ResolveCoordinatorAddress(const std::string& flag_value);

// SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(v1::JobState state);
// "RUNNING", "SUCCEEDED", ... (the proto enum name).
std::string JobStateName(v1::JobState state);

class CoordinatorClient {
 public:
  explicit CoordinatorClient(const std::string& address,
                             absl::Duration deadline = absl::Seconds(10));
  ~CoordinatorClient();

  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  // Errors: INVALID_ARGUMENT with the coordinator's message (which names the
  // offending key) for a bad spec; UNAVAILABLE "cannot reach the coordinator
  // at ADDR (...)" when nothing answers at the address.
  absl::StatusOr<std::string> Submit(const std::string& job_spec_yaml);  // job id
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id);
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(int limit = 0);
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& job_id, const std::string& reason);
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();

  // Streams the job's events until the job reaches a terminal state (returns
  // its last status), `on_event` returns false (returns the last status seen,
  // not terminal), or the stream breaks (error). The stream itself has no
  // deadline: jobs run for hours. StopWatching() from another thread ends it
  // with CANCELLED.
  absl::StatusOr<v1::JobStatus> Watch(const std::string& job_id,
                                      const std::function<bool(const v1::JobEvent&)>& on_event);

  // Ends every Watch in progress on this client with CANCELLED, and makes
  // later Watch calls return CANCELLED at once (sticky, so a stop that races
  // with the start of a Watch is never lost). Thread-safe; meant for a
  // signal-handling or supervising thread.
  void StopWatching();

  // Polls ListWorkers until at least `count` workers are registered.
  // UNAVAILABLE is retried until the timeout (the coordinator may be starting);
  // other errors return at once. `keep_going`, when given, is called between
  // polls; a non-OK result ends the wait with that status (e.g. a child
  // process died, or the user pressed Ctrl-C).
  absl::Status WaitForWorkers(int count, absl::Duration timeout,
                              const std::function<absl::Status()>& keep_going = nullptr);

  const std::string& address() const { return address_; }

 private:
  // grpc::Status -> absl::Status, with the connection hint on UNAVAILABLE and
  // on deadlines that expired before a connection was made.
  absl::Status Convert(const grpc::Status& status);
  void SetDeadline(grpc::ClientContext* ctx) const;

  std::string address_;
  absl::Duration deadline_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;

  absl::Mutex mu_;
  std::set<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace stagewise::client

#endif  // STAGEWISE_CLIENTS_CLIENT_COORDINATOR_CLIENT_H_
