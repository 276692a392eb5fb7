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
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.grpc.pb.h"

namespace stagewise::client {

inline constexpr char kDefaultCoordinatorAddress[] = "127.0.0.1:7070";
inline constexpr char kCoordinatorEnvVar[] = "STAGEWISE_COORDINATOR";

// Address resolution: the flag if set, else $STAGEWISE_COORDINATOR, else
// "127.0.0.1:7070".
std::string ResolveCoordinatorAddress(const std::string& flag_value);

// How a watch survives the coordinator going away (a restart, a network
// blip): reconnect with exponential backoff, up to a time limit.
struct ReconnectPolicy {
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(2);
  // How long the coordinator may stay unreachable before the watch gives up
  // (UNAVAILABLE); zero or less: never reconnect.
  absl::Duration give_up_after = absl::Minutes(10);
};

// Delays between reconnection attempts: `initial`, doubling, at most `max`,
// each jittered (between half and all of it: Jittered, retry_policy.h).
class Backoff {
 public:
  Backoff(absl::Duration initial, absl::Duration max) : initial_(initial), max_(max) {}
  absl::Duration Next();
  void Reset() { next_ = absl::ZeroDuration(); }

 private:
  absl::Duration initial_;
  absl::Duration max_;
  absl::Duration next_ = absl::ZeroDuration();
  absl::BitGen gen_;
};

// Whether a watch that broke is worth reconnecting: the coordinator could not
// be reached (UNAVAILABLE), or it ended the stream before the job did
// (ABORTED, CANCELLED, UNKNOWN: a server shutting down or killed). NOT_FOUND,
// INVALID_ARGUMENT and the like are answers, not outages.
bool IsReconnectable(const absl::Status& status);

// A watch lost or regained its coordinator (see WatchReconnecting).
struct ConnectionChange {
  bool lost = false;   // true: the stream broke; false: events flow again
  std::string reason;  // lost: why, without the "cannot reach ..." hint
  absl::Duration down_for = absl::ZeroDuration();  // regained: how long it was lost
};

// SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(v1::JobState state);
// "RUNNING", "SUCCEEDED", ... (the proto enum name).
std::string JobStateName(v1::JobState state);

// The transport security and bearer token of every CoordinatorClient made
// without its own (the CLI sets them once from its flags; plaintext and no
// token until then).
void SetDefaultClientOptions(const rpc::RpcOptions& options);
rpc::RpcOptions DefaultClientOptions();

class CoordinatorClient {
 public:
  explicit CoordinatorClient(const std::string& address,
                             absl::Duration deadline = absl::Seconds(10),
                             const rpc::RpcOptions& options = DefaultClientOptions());
  ~CoordinatorClient();

  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  // Errors: INVALID_ARGUMENT with the coordinator's message (which names the
  // offending key) for a bad spec; UNAVAILABLE "cannot reach the coordinator
  // at ADDR (...)" when nothing answers at the address.
  // The job id. `suspended`: the job waits outside the queue until Resume.
  absl::StatusOr<std::string> Submit(const std::string& job_spec_yaml, bool suspended = false);
  // Releases a job submitted suspended into the queue.
  absl::StatusOr<v1::JobStatus> Resume(const std::string& job_id);
  // Moves a waiting job to another priority class (SetJobPriority).
  absl::StatusOr<v1::JobStatus> SetPriority(const std::string& job_id, const std::string& priority);
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id);
  // Newest first, at most `limit` (0: every job), a page at a time.
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(int limit = 0);
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& job_id, const std::string& reason);
  absl::StatusOr<std::vector<v1::WorkerInfo>> ListWorkers();
  // The job's committed checkpoints (newest first), the step directories that
  // were skipped and why, and the job's checkpoint directory, as the
  // coordinator sees them. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(const std::string& job_id);
  // The job's event log (ListJobEvents), oldest first. NOT_FOUND for an unknown job.
  absl::StatusOr<v1::ListJobEventsResponse> ListJobEvents(const std::string& job_id);
  // An online copy of the coordinator's database (BackupDatabase, admin
  // role) written to `path` (through `path`.part, renamed at the end;
  // ALREADY_EXISTS if `path` exists). `progress` (optional) sees the bytes
  // received and the total after each chunk. Returns the bytes written.
  absl::StatusOr<int64_t> BackupDatabase(
      const std::string& path,
      const std::function<void(int64_t done, int64_t total)>& progress = nullptr);
  // The job's metric history (GetJobMetrics), every metric.
  absl::StatusOr<v1::JobMetrics> GetJobMetrics(const std::string& job_id);
  // The job's pipeline timeline (GetJobTrace), on the coordinator's clock.
  absl::StatusOr<v1::JobTrace> GetJobTrace(const std::string& job_id);
  // Worker-seconds by use (GetGoodput): the job's, or the cluster's for "".
  absl::StatusOr<v1::Goodput> GetGoodput(const std::string& job_id);

  // Streams the job's events until the job reaches a terminal state (returns
  // its last status), `on_event` returns false (returns the last status seen,
  // not terminal), or the stream breaks (error). The stream itself has no
  // deadline: jobs run for hours. StopWatching() from another thread ends it
  // with CANCELLED.
  absl::StatusOr<v1::JobStatus> Watch(const std::string& job_id,
                                      const std::function<bool(const v1::JobEvent&)>& on_event);

  // Watch, surviving a coordinator restart: when a stream that delivered at
  // least one event breaks in a reconnectable way (IsReconnectable), watches
  // again after a backoff until events flow again, and gives up with
  // UNAVAILABLE ("lost the coordinator at ADDR for 10m; gave up watching job
  // ...") once the coordinator has been gone for `policy.give_up_after`. A
  // first stream that breaks before any event returns its error at once (a
  // wrong address should not hang). `on_change` (optional) hears of every loss
  // and recovery, on the calling thread. StopWatching() ends it, also while
  // it waits to reconnect.
  absl::StatusOr<v1::JobStatus> WatchReconnecting(
      const std::string& job_id, const std::function<bool(const v1::JobEvent&)>& on_event,
      const ReconnectPolicy& policy,
      const std::function<void(const ConnectionChange&)>& on_change = nullptr);

  // Ends every Watch in progress on this client with CANCELLED, and makes
  // later Watch calls return CANCELLED at once (sticky, so a stop that races
  // with the start of a Watch is never lost). Thread-safe; meant for a
  // signal-handling or supervising thread.
  void StopWatching();
  // Whether StopWatching() was called.
  bool IsStopped();

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
  // The call's deadline and bearer token.
  void SetDeadline(grpc::ClientContext* ctx) const;
  void AddToken(grpc::ClientContext* ctx) const;
  // "cannot reach the coordinator at ADDR (is it running? ...): "
  std::string UnreachableHint() const;
  // Sleeps for `d` or until StopWatching(); true if stopped.
  bool SleepUnlessStopped(absl::Duration d);

  std::string address_;
  absl::Duration deadline_;
  std::string token_;    // bearer token ("" = none)
  std::string version_;  // sent as x-stagewise-version
  rpc::RpcOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;

  absl::Mutex mu_;
  // What Watch calls: the main stub until a reconnection replaces it with
  // one on a fresh channel (a channel whose connection attempts overlapped
  // the coordinator's restart can wait out gRPC's connect timeout first).
  std::shared_ptr<v1::Coordinator::Stub> watch_stub_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace stagewise::client

#endif  // STAGEWISE_CLIENTS_CLIENT_COORDINATOR_CLIENT_H_
