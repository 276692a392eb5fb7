// The coordinator's core: job queue and state machine, worker registry,
// partition assignment, progress and results. Transport-free: the gRPC
// service in coordinator_service.cc adapts it. Every state transition is
// persisted in the JobStore before it is acted on.
#ifndef STAGEWISE_COORDINATOR_JOB_MANAGER_H_
#define STAGEWISE_COORDINATOR_JOB_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/store.h"
#include "services/common/job_spec.h"
#include "services/metrics/metrics.h"
#include "services/models/block_info.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

// How the manager reaches one connected worker (its control stream).
class CommandSink {
 public:
  virtual ~CommandSink() = default;
  // Non-blocking; false once the stream is gone.
  virtual bool Send(const v1::Command& command) = 0;
  // Ends the stream with `status` (e.g. the worker missed its heartbeats).
  virtual void Close(const absl::Status& status) = 0;
};

struct JobManagerOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration housekeeping = absl::Milliseconds(250);
};

class JobManager {
 public:
  JobManager(JobStore* store, metrics::CoordinatorMetrics* metrics, JobManagerOptions options = {});
  ~JobManager();

  // Resumes persisted state (jobs interrupted by a restart are failed with a
  // reason until recovery exists) and starts housekeeping.
  absl::Status Start();
  void Stop();

  // Clients.
  absl::StatusOr<std::string> Submit(const std::string& job_spec_yaml);
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id) const;
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(int limit) const;
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& job_id, const std::string& reason);
  std::vector<v1::WorkerInfo> ListWorkers() const;

  // Watchers get the current status at once, then every change; the last event
  // of a job carries a terminal state. Listeners must not block.
  using Listener = std::function<void(const v1::JobEvent&)>;
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id, Listener listener);
  void Unsubscribe(int64_t subscription);

  // Workers.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::WorkerInfo& info);
  // The worker's control stream is open (first event received).
  absl::Status Connect(const std::string& worker_id, CommandSink* sink);
  // The stream ended; `sink` guards against a newer stream of the same worker.
  void Disconnect(const std::string& worker_id, CommandSink* sink, const absl::Status& why);
  void OnEvent(const v1::WorkerEvent& event);

 private:
  struct Worker {
    v1::WorkerInfo info;
    CommandSink* sink = nullptr;
    absl::Time last_seen;
    std::string job_id;  // empty when idle
    int stage = -1;
  };
  struct ActiveJob {
    JobSpec spec;
    std::string yaml;
    std::vector<std::pair<int, int>> ranges;
    // The planner (PROFILING): a worker profiles the model, then ranges and
    // block modes come from the plan.
    bool needs_plan = false;
    bool planned = false;
    std::vector<std::vector<std::string>> modes;  // per stage, per block; empty = default
    std::vector<std::string> workers;             // by stage
    std::set<int64_t> pending_acks;
    std::set<int> finished_stages;
    std::map<int, std::set<int>> phase_done;  // phase -> stages that finished it
    int64_t last_step = 0;
    absl::Time last_step_time;
    absl::Time started;
  };

  static ActiveJob NewActiveJob(const JobSpec& spec, const std::string& yaml,
                                const std::vector<models::BlockInfo>& blocks,
                                const std::vector<std::pair<int, int>>& ranges);
  void Housekeeping();
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persists, updates metrics and notifies watchers. False if the store refused.
  bool TransitionLocked(const std::string& job_id, v1::JobState to, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateStatusLocked(const v1::JobStatus& status, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyLocked(const v1::JobStatus& status, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends an active job: stops its stages, frees its workers.
  void EndJobLocked(const std::string& job_id, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends every stage its StageAssignment (job.workers already chosen).
  void ConfigureLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's profile arrived: plan, record the plan, configure.
  void OnProfileLocked(const v1::ProfileResult& result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendLocked(const std::string& worker_id, v1::Command command)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLostLocked(const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobStore* store_;
  metrics::CoordinatorMetrics* metrics_;
  const JobManagerOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ActiveJob> active_ ABSL_GUARDED_BY(mu_);        // CONFIGURING/RUNNING
  std::vector<std::string> pending_ ABSL_GUARDED_BY(mu_);               // PENDING, in order
  std::map<std::string, v1::JobStatus> statuses_ ABSL_GUARDED_BY(mu_);  // cache of live jobs
  std::map<int64_t, std::pair<std::string, Listener>> listeners_ ABSL_GUARDED_BY(mu_);
  int64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_command_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread housekeeping_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_JOB_MANAGER_H_
