// Durable coordinator state in an embedded SQLite file (WAL): jobs, their
// state transitions and their metric history. Every transition is written
// here before the coordinator acts on it, so a restarted coordinator can
// resume. No LibTorch.
#ifndef STAGEWISE_COORDINATOR_STORE_H_
#define STAGEWISE_COORDINATOR_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

struct JobRecord {
  v1::JobStatus status;   // status.job_id is the key
  std::string spec_yaml;  // the job as submitted
};

struct MetricPoint {
  int64_t step = 0;
  std::string name;  // e.g. "train_loss", "eval_accuracy", "samples_per_second"
  double value = 0;
  int64_t unix_ms = 0;
};

struct TransitionRecord {
  v1::JobState from = v1::JOB_STATE_UNSPECIFIED;
  v1::JobState to = v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
  int64_t unix_ms = 0;
};

// True for SUCCEEDED, FAILED, CANCELLED.
bool IsTerminal(v1::JobState state);
// Whether the state machine allows from -> to (docs/architecture.md, "Job state
// machine"):
// PENDING -> PROFILING | CONFIGURING | CANCELLED | FAILED; PROFILING -> CONFIGURING | ...;
// CONFIGURING -> RUNNING | FAILED | CANCELLED | PENDING | RECOVERING; RUNNING <-> CHECKPOINTING;
// RUNNING -> SUCCEEDED | FAILED | CANCELLED | RECOVERING; RECOVERING -> CONFIGURING | PROFILING
// (a job that never got its plan) | FAILED | CANCELLED; terminal states go nowhere.
// Also: every non-terminal state -> FAILED | CANCELLED; PROFILING -> PENDING
// (like CONFIGURING -> PENDING: the workers went away before placement);
// CHECKPOINTING -> RECOVERING (a worker lost mid-checkpoint). No self-loops,
// nothing to or from JOB_STATE_UNSPECIFIED.
bool IsAllowedTransition(v1::JobState from, v1::JobState to);

struct JobStoreOptions {
  // How long a write waits for another connection's lock before the call
  // fails with UNAVAILABLE.
  absl::Duration busy_timeout = absl::Seconds(5);
};

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`; ":memory:" for tests.
  // Creates or migrates the schema; enables WAL and foreign keys.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        const JobStoreOptions& options);
  // A consistent copy of the database in a new file at `path` while the store
  // goes on serving (SQLite's online backup, a few hundred pages at a time
  // under the store's lock, so writers wait at most one step; what they
  // change meanwhile is in the copy). The copy opens with Open() as it is.
  // ALREADY_EXISTS if `path` exists; nothing is left at `path` on failure.
  absl::Status Backup(const std::string& path) const;
  // PRAGMA user_version of a database this binary created or migrated.
  static constexpr int kSchemaVersion = 2;
  ~JobStore();

  // New job in state PENDING. ALREADY_EXISTS if the id is taken.
  absl::Status CreateJob(const JobRecord& record);
  // Replaces the stored status (progress fields: step, losses, ...) without a
  // state change; INVALID_ARGUMENT if it would change the state.
  absl::Status UpdateStatus(const v1::JobStatus& status);
  // Moves a job to `to` atomically with the transition log entry;
  // FAILED_PRECONDITION naming both states if the machine forbids it.
  absl::StatusOr<v1::JobStatus> Transition(const std::string& job_id, v1::JobState to,
                                           const std::string& reason);
  absl::StatusOr<JobRecord> GetJob(const std::string& job_id) const;
  // Newest first; limit <= 0 means all.
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(int limit) const;
  // One page of ListJobs: at most `page_size` (>= 1) jobs after `page_token`
  // ("" = the newest), fewer when their statuses would pass `max_bytes` (at
  // least one); next_page_token is empty on the last page. INVALID_ARGUMENT
  // "page_token: ..." for a token this store did not issue.
  struct JobPage {
    std::vector<v1::JobStatus> jobs;
    std::string next_page_token;
  };
  absl::StatusOr<JobPage> ListJobsPage(int page_size, const std::string& page_token,
                                       size_t max_bytes) const;
  // Jobs not in a terminal state, oldest first (what a restarted coordinator resumes).
  absl::StatusOr<std::vector<JobRecord>> UnfinishedJobs() const;
  // A job's state transitions, oldest first. With `notes`, also its notes
  // (what happened within a state that an operator wants in the event log:
  // "planned", "checkpoint at step 100 committed", "not rebalancing: ..."),
  // stored as transitions from a state to itself.
  absl::StatusOr<std::vector<TransitionRecord>> Transitions(const std::string& job_id,
                                                            bool notes = false) const;

  absl::Status AppendMetrics(const std::string& job_id, const std::vector<MetricPoint>& points);
  // Progress of live jobs in one transaction (one fsync, all or nothing):
  // every status replaces the stored one as UpdateStatus does (no state
  // change), then every point is appended as AppendMetrics does, then every
  // note.
  struct ProgressBatch {
    std::vector<v1::JobStatus> statuses;
    std::vector<std::pair<std::string, MetricPoint>> points;  // (job_id, point), in order
    // (job_id, note): from == to, the state it happened in (Transitions).
    std::vector<std::pair<std::string, TransitionRecord>> notes = {};
  };
  absl::Status WriteProgress(const ProgressBatch& batch);
  // All points of a job in insertion order, optionally only one name.
  absl::StatusOr<std::vector<MetricPoint>> Metrics(const std::string& job_id,
                                                   const std::string& name = "") const;

  // Pipeline timelines (docs/trace.md): a stage's chunk of spans as it sent
  // it; NOT_FOUND for an unknown job.
  absl::Status AppendTrace(const std::string& job_id, const v1::TraceChunk& chunk);
  // The spans stored for a job so far (0 for none or an unknown job).
  absl::StatusOr<int64_t> TraceSpans(const std::string& job_id) const;
  // Every chunk of a job in the order stored.
  absl::StatusOr<std::vector<v1::TraceChunk>> Trace(const std::string& job_id) const;

  // A fresh job id: "job-" + 8 random hex digits, not yet used.
  std::string NewJobId() const;

 private:
  struct Impl;
  explicit JobStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_STORE_H_
