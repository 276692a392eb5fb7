// The coordinator's core, transport-free (coordinator_service.cc adapts it to
// gRPC). JobManager owns the live jobs (live_job.h) and the loop thread, and
// wires the parts that act on them, each in its own file (as Ray's GCS wires
// its managers):
//   - WorkerRegistry (worker_registry.h): registration, control streams,
//     heartbeats, idle/busy;
//   - Scheduler (scheduler.h): the PENDING queue and who gets workers;
//   - JobPlacer (job_placement.h): the scheduling pass, the PROFILING step
//     and the plan, stage assignments, the queue a job goes back to;
//   - TaskLoop (task_loop.h): the loop thread and its bounded task queue;
//   - AdmitEvent (event_admission.h): which worker events are taken;
//   - JobRecovery (job_recovery.h) and CheckpointCommitter
//     (checkpoint_commit.h): fault tolerance and checkpoint commits, acting
//     through the narrow JobHost interface (job_host.h) that JobManager
//     implements;
//   - JobStatusView (job_view.h) and JobQueries (job_queries.h): the published
//     statuses, watchers and the read-only queries;
//   - the job lifecycle (here): the state machine, phases, progress, results.
// Every state transition is persisted in the JobStore before it is acted on.
//
// Threading and ownership:
//   - One manager thread, the loop (started by Start, joined by Stop), owns the
//     live jobs, the Scheduler and the CommandSink traffic, and is the only
//     thread that writes the store after Start (except Submit's CreateJob). It
//     runs tasks from a bounded FIFO queue, one at a time, and between them
//     expires workers that missed their heartbeats (a timed wait on the queue,
//     no polling), flushes batched progress and drops the metric series of
//     jobs that ended long enough ago.
//   - gRPC callback threads call OnEvent, Connect and Disconnect: they update
//     the WorkerRegistry (its own leaf mutex), enqueue a task and return at
//     once; they block only while the queue is full (backpressure on that
//     worker's stream). Heartbeats are not enqueued at all.
//   - Submit validates and writes the new job (one durable write) on the
//     caller's thread with no manager lock held, then enqueues it. Cancel
//     enqueues the cancellation and waits for the loop to persist it.
//   - GetJob, ListJobs, ListWorkers, Subscribe and Unsubscribe read a view of
//     the live jobs' statuses (JobStatusView) that the loop publishes after each
//     change, the registry, or the store. No lock is held during a store write.
//   - Listeners run on the loop thread (or, for the first event, on the
//     subscriber's thread) under the view's mutex: they must not block nor call back
//     into the manager.
// Progress (MetricsReport, StageResult, PENDING reasons) is written in
// batches (JobStore::WriteProgress: one transaction) when the queue runs dry,
// every progress_flush_interval, and before any transition of the job.
#ifndef STAGEWISE_COORDINATOR_JOB_MANAGER_H_
#define STAGEWISE_COORDINATOR_JOB_MANAGER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_commit.h"
#include "coordinator/collective_store.h"
#include "coordinator/goodput_tracker.h"
#include "coordinator/job_host.h"
#include "coordinator/job_placement.h"
#include "coordinator/job_queries.h"
#include "coordinator/job_recovery.h"
#include "coordinator/job_view.h"
#include "coordinator/live_job.h"
#include "coordinator/owner_usage.h"
#include "coordinator/planned_stop.h"
#include "coordinator/preemption.h"
#include "coordinator/rebalancer.h"
#include "coordinator/scheduler.h"
#include "coordinator/stage_replacement.h"
#include "coordinator/store.h"
#include "coordinator/task_loop.h"
#include "coordinator/worker_registry.h"
#include "services/common/check.h"
#include "services/common/path_policy.h"
#include "services/metrics/metrics.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

struct JobManagerOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // The loop's longest wait when nothing is due (an upper bound: heartbeat
  // expiry and flushes wake it when they are due).
  absl::Duration housekeeping = absl::Milliseconds(250);
  // Longest delay of a progress write while events keep arriving.
  absl::Duration progress_flush_interval = absl::Milliseconds(100);
  // How long a finished job's stagewise_job_*{job} series stay exported (so
  // a scraper sees the final values) before CoordinatorMetrics::RemoveJob.
  absl::Duration finished_job_metrics_ttl = absl::Minutes(5);
  // Tasks waiting for the loop before OnEvent & co. block.
  size_t max_queued_tasks = 4096;
  // How long the stages of a (re)placed job may take to acknowledge their
  // StageAssignment before the attempt is given up (and recovered).
  absl::Duration configure_timeout = absl::Seconds(120);
  // How long a recovering job waits before it is placed again, so that every
  // loss of one fault (two workers killed together) is known first and none
  // of the lost workers is chosen (--recovery-settle).
  absl::Duration recovery_settle = absl::Seconds(1);
  // Jobs one owner may have that have not ended (PENDING to RECOVERING).
  int max_live_jobs_per_owner = 100;
  // Where a job's checkpoint.dir may point (the binary's --checkpoint-root);
  // a spec naming a directory elsewhere is refused at submit.
  PathRoots checkpoint_roots;
  // --scheduling-config: priority classes, quotas and fair share
  // (docs/operations.md, "Sharing the cluster"); none: FIFO with backfill.
  std::optional<SharingConfig> sharing;
};

class JobManager : private JobHost {
 public:
  JobManager(JobStore* store, metrics::CoordinatorMetrics* metrics, JobManagerOptions options = {});
  ~JobManager();

  // Resumes persisted state (jobs a restart interrupted are recovered from
  // their newest committed checkpoint) and starts the loop thread.
  absl::Status Start();
  // Runs the tasks already queued, flushes progress and joins the loop.
  void Stop();

  // Clients.
  // `owner`: who submitted it (a token's name; recorded in JobStatus.owner).
  // RESOURCE_EXHAUSTED when the owner has max_live_jobs_per_owner jobs that
  // have not ended; INVALID_ARGUMENT naming `priority` for a class the
  // scheduling config does not have, or the owner's quota for a job that
  // needs more workers than it may ever hold.
  // `suspended`: the job waits, PENDING and outside the queue, until
  // Release (an external queue owns admission).
  absl::StatusOr<std::string> Submit(const std::string& job_spec_yaml,
                                     const std::string& owner = "", bool suspended = false);
  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id) const {
    return queries_.GetJob(job_id);
  }
  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs(int limit) const {
    return queries_.ListJobs(limit);
  }
  absl::StatusOr<JobStore::JobPage> ListJobsPage(int page_size, const std::string& page_token,
                                                 size_t max_bytes) const {
    return queries_.ListJobsPage(page_size, page_token, max_bytes);
  }
  // INVALID_ARGUMENT for a reason over kMaxCancelReasonBytes.
  absl::StatusOr<v1::JobStatus> Cancel(const std::string& job_id, const std::string& reason);
  // Queues a job submitted suspended (durably). NOT_FOUND for an unknown
  // job, FAILED_PRECONDITION for one that is not suspended.
  absl::StatusOr<v1::JobStatus> Release(const std::string& job_id);
  // Moves a job that waits to be placed (PENDING, or RECOVERING between
  // attempts) to class `priority`, durably. INVALID_ARGUMENT naming
  // `priority` for an unknown class; FAILED_PRECONDITION for a placed or
  // ended job (a running job's class does not change under it).
  absl::StatusOr<v1::JobStatus> SetPriority(const std::string& job_id, const std::string& priority);
  std::vector<v1::WorkerInfo> ListWorkers() const;
  std::map<std::string, absl::Time> WorkersLastSeen() const { return registry_.LastSeen(); }
  metrics::CoordinatorMetrics* metrics() const { return metrics_; }
  // The job's committed checkpoints, newest first, read from checkpoint.dir
  // (the coordinator must reach it); NOT_FOUND for an unknown job, an empty
  // list for a job without checkpoint.dir.
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(const std::string& job_id) const {
    return queries_.ListCheckpoints(job_id);
  }
  absl::StatusOr<v1::ListJobEventsResponse> JobEvents(const std::string& job_id) const {
    return queries_.JobEvents(job_id);
  }
  // An online copy of the database in a new file (JobStore::Backup).
  absl::Status BackupDatabase(const std::string& path) const { return store_->Backup(path); }
  // The job's stored metric history (what was flushed; a finished job's is
  // complete), at most `max_points` per metric (<= 0: 5000), evenly thinned.
  absl::StatusOr<v1::JobMetrics> JobMetrics(const std::string& job_id,
                                            const std::vector<std::string>& names,
                                            int max_points) const {
    return queries_.JobMetrics(job_id, names, max_points);
  }
  // The spans the job's stages recorded (its `trace:` section), on this
  // coordinator's clock, by stage and attempt. At most kMaxTraceSpans are
  // kept per job; NOT_FOUND for an unknown job.
  static constexpr int kMaxTraceSpans = 150000;
  // A cancel reason is stored with the job: longer ones are refused.
  static constexpr size_t kMaxCancelReasonBytes = 1024;
  // A suspended job's reason while it waits for Release.
  static constexpr char kSuspendedReason[] =
      "suspended: waiting to be released (stagewise resume JOB)";
  absl::StatusOr<v1::JobTrace> JobTrace(const std::string& job_id) const {
    return queries_.JobTrace(job_id);
  }
  // Worker-seconds by use (coordinator/goodput.h): the job's (NOT_FOUND for
  // an unknown one), or with an empty id the cluster's since Start.
  absl::StatusOr<v1::Goodput> Goodput(const std::string& job_id);
  // The cluster's as the loop last published it (at most a second old).
  v1::Goodput PublishedGoodput() const ABSL_LOCKS_EXCLUDED(goodput_mu_) {
    absl::MutexLock lock(&goodput_mu_);
    return published_goodput_;
  }

  // Watchers get the current status at once, then every change; the last event
  // of a job carries a terminal state. Listeners must not block.
  using Listener = JobStatusView::Listener;
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id, Listener listener) {
    return view_.Subscribe(job_id, std::move(listener));
  }
  void Unsubscribe(int64_t subscription) { view_.Unsubscribe(subscription); }

  // Workers.
  // `caller`: who called (its authenticated identity), recorded with the
  // registration; the response carries the session its Control stream needs.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::WorkerInfo& info,
                                                      const WorkerRegistry::Caller& caller = {});
  // The worker's control stream is open (first event received).
  // PERMISSION_DENIED unless `session` and `caller` are those of the worker's
  // registration (see WorkerRegistry::Connect).
  absl::Status Connect(const std::string& worker_id, const std::string& session, CommandSink* sink,
                       const WorkerRegistry::Caller& caller = {});
  // The stream ended; `sink` guards against a newer stream of the same worker.
  // The manager never uses `sink` once this returns.
  void Disconnect(const std::string& worker_id, CommandSink* sink, const absl::Status& why);
  // Coordinator.CollectiveStore on behalf of request.worker_id(): its session
  // and `caller` must be its registration's, and it must hold a stage of
  // the job in request.attempt() (PERMISSION_DENIED / FAILED_PRECONDITION
  // otherwise); then CollectiveStores::Apply.
  absl::Status CollectiveStore(const v1::CollectiveStoreRequest& request,
                               const WorkerRegistry::Caller& caller,
                               v1::CollectiveStoreResponse* response);
  // `event.worker_id()` is the sender: the caller (the Control stream) has
  // checked that it is the worker whose registration opened the stream.
  void OnEvent(const v1::WorkerEvent& event);

 private:
  using Job = LiveJob;

  // The loop's hooks (TaskLoop::Hooks): between tasks, scheduling passes,
  // goodput ticks and due flushes; between batches, housekeeping.
  TaskLoop::Hooks LoopHooks();
  // When the loop must wake up although no task arrived.
  absl::Time NextDeadline() const;
  // Heartbeat expiry, due flushes, expired metric series.
  void Housekeeping(absl::Time now);
  // Start: a job the store had unfinished, queued or recovered again.
  void Resume(const JobRecord& record);
  // Every method below runs on the loop thread (or on the Start caller
  // before the loop exists); each checks it with OnLoop().
  bool OnLoop() const { return loop_.OnLoop(); }

  // Per-event handlers: AdmitEvent decides, these act.
  void HandleEvent(const v1::WorkerEvent& event);
  void OnAck(const v1::Ack& ack, const std::string& sender);
  void OnMetrics(const std::string& job_id, int stage, const v1::MetricsReport& report);
  void OnTrace(const v1::WorkerEvent& event);
  void OnResult(const std::string& job_id, int stage, int replica, const v1::StageResult& result);
  void OnPhaseDone(const std::string& job_id, int slot, const v1::PhaseDone& done);
  void OnWorkerLost(const WorkerRegistry::Removed& worker, const std::string& why);
  // WorkerEvent.preempting: no new work for the worker; its job checkpoints
  // and resumes without it (PlannedStops).
  void OnPreempting(const std::string& worker_id, const v1::Preempting& preempting);

  // The lifecycle.
  void Admit(Job job);
  absl::StatusOr<v1::JobStatus> CancelJob(const std::string& job_id, const std::string& reason);
  // Release and SetPriority on the loop: NOT_FOUND for an unknown job,
  // FAILED_PRECONDITION naming the state of an ended one (between `prefix`
  // and `suffix`); else `act` on the live job.
  absl::StatusOr<v1::JobStatus> OnLiveJob(
      const std::string& job_id, const std::string& prefix, const std::string& suffix,
      const std::function<absl::StatusOr<v1::JobStatus>(LiveJob&)>& act);
  void FlushProgress();
  void Send(const std::string& worker_id, v1::Command command) override;
  int64_t NewCommandId() override { return next_command_++; }
  void RefreshGauges();
  // The pool's state into the cluster's goodput count (after every task).
  void TickGoodput();

  // JobHost (job_host.h), for JobRecovery and CheckpointCommitter.
  LiveJob* FindJob(const std::string& job_id) override;
  std::vector<std::string> LiveJobIds() const override;
  // Persists (after flushing the job's progress), counts, publishes. The
  // persisted status, or the store's error (logged).
  absl::StatusOr<v1::JobStatus> Transition(const std::string& job_id, v1::JobState to,
                                           const std::string& reason) override;
  void EndJob(std::string job_id, v1::JobState state, std::string reason) override;
  void UpdateProgress(Job& job, const std::string& message,
                      std::vector<MetricPoint> points) override;
  absl::Status ChangeStatus(LiveJob& job,
                            const std::function<void(v1::JobStatus&)>& change) override;
  void StopStages(const std::string& job_id, const std::string& reason) override;
  void Requeue(const std::string& job_id, bool recovering) override {
    placer_.Requeue(job_id, recovering);
  }

  JobStore* const store_;
  metrics::CoordinatorMetrics* const metrics_;
  const JobManagerOptions options_;
  WorkerRegistry registry_;      // thread-safe
  CollectiveStores collective_;  // thread-safe
  JobStatusView view_{store_};   // thread-safe
  const JobQueries queries_{store_, &view_};

  // Loop thread only (and the Start caller before the loop exists).
  Scheduler scheduler_{&registry_};
  JobRecovery recovery_{this, metrics_, options_.configure_timeout};
  CheckpointCommitter committer_{this, metrics_};
  PlannedStops planned_{this, &recovery_};
  Rebalancer rebalancer_{this, &planned_, &scheduler_};
  StageReplacer replacer_{this, &registry_, &scheduler_};
  // The scheduling config's (an empty one without --scheduling-config).
  const SharingConfig sharing_ = options_.sharing.value_or(SharingConfig{});
  OwnerUsage usage_;  // who holds workers, and how much each owner used them
  GoodputTracker goodput_;
  absl::Time goodput_published_ = absl::InfinitePast();  // the metrics' last update
  absl::Time next_sharing_pass_ = absl::InfinitePast();  // priority classes: a pass a second
  Preemptor preemptor_{this, &planned_, &registry_};
  JobPlacer placer_{
      this,
      {&scheduler_, &registry_, &recovery_, &planned_, &preemptor_, &usage_, &goodput_, &sharing_,
       options_.configure_timeout, options_.recovery_settle, [this] { return OnLoop(); }}};
  std::map<std::string, Job> jobs_;
  std::set<std::string> dirty_;                                  // jobs with unwritten status
  std::vector<std::pair<std::string, MetricPoint>> points_;      // unwritten metric history
  std::vector<std::pair<std::string, TransitionRecord>> notes_;  // unwritten event log notes
  absl::Time flush_due_ = absl::InfiniteFuture();
  std::deque<std::pair<absl::Time, std::string>> metrics_expiry_;  // (when, job) in order
  int64_t next_command_ = 1;
  // Worker events AdmitEvent refused (for bounded logging).
  int64_t refused_events_ = 0;

  mutable absl::Mutex goodput_mu_;
  v1::Goodput published_goodput_ ABSL_GUARDED_BY(goodput_mu_);

  TaskLoop loop_{options_.max_queued_tasks, LoopHooks()};  // last: its hooks use the above
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_JOB_MANAGER_H_
