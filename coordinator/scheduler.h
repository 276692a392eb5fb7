// The coordinator's scheduler: the queue of PENDING jobs and their placement
// on idle workers, and the placement-side commands (the ProfileCommand of the
// PROFILING step, the StageAssignments of CONFIGURING, the plan that turns a
// worker's profile into stage ranges and block modes).
//
// Policy: FIFO with backfill. Jobs are considered in submission order; a job
// is placed as soon as enough workers are idle (the first idle workers by id,
// stage j on the j-th); a job that does not fit keeps its place while a later,
// smaller job may take the idle workers.
//
// With a scheduling config (SetSharing; docs/operations.md, "Sharing the
// cluster") the order is: priority class (highest first), then jobs that
// already ran (recovering), then the owner's dominant share per unit of
// weight (least first: weighted fair share; its larger share of the pool's
// workers and of its GPU workers, in decayed worker-seconds), then
// submission. An owner at
// its quota (max_workers, max_running_jobs) waits. A job of a lower class is
// not placed on the idle workers a waiting job of a higher class needs
// (backfill only within a class); gang admission: all of a job's workers at
// once, or none.
//
// Threading: not thread-safe. Owned and called by the JobManager's loop thread
// only; it reaches workers through the (thread-safe) WorkerRegistry. It never
// writes the store: the JobManager persists each placement's transition before
// sending the commands built here.
#ifndef STAGEWISE_COORDINATOR_SCHEDULER_H_
#define STAGEWISE_COORDINATOR_SCHEDULER_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cut.h"
#include "coordinator/owner_usage.h"
#include "coordinator/worker_registry.h"
#include "services/spec/job_spec.h"
#include "services/spec/sharing.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class Scheduler {
 public:
  explicit Scheduler(WorkerRegistry* registry) : registry_(registry) {}

  struct Request {
    std::string job_id;
    int workers = 1;          // one per stage and replica: J x R
    bool profile = false;     // needs a ProfileCommand (PROFILING) before its stages
    bool recovering = false;  // set by Requeue
    // placement.distinct_identities: no two stages on one certificate.
    bool distinct_identities = false;
    // Not placed before this time (a recovering job waits for the losses of
    // one fault to settle: --recovery-settle).
    absl::Time not_before = absl::InfinitePast();
    int stages = 0;  // J (0: workers)
    // recovery.elastic: when `workers` are not idle, place stages x r
    // workers instead, for the first r here that fits (most first).
    std::vector<int> fewer_replicas = {};
    // placement.labels: only workers with every "key=value" of these.
    std::vector<std::string> labels = {};
    // recovery.min_stages: when `workers` are not idle, place this many
    // stages (one worker each) instead, for the first count here that fits
    // (most first); the owner cuts the job anew (CutFewerStages).
    std::vector<int> fewer_stages = {};
    // The scheduling config's view: who submitted it, its class's rank (0
    // the highest).
    std::string owner = {};
    int rank = 0;
    int64_t seq = 0;  // set by Enqueue / Requeue: submission order
  };
  // Orders the queue by class and fair share and applies quotas (both
  // outlive the scheduler's use of them; null: FIFO with backfill).
  void SetSharing(const SharingConfig* config, const OwnerUsage* usage) {
    config_ = config;
    usage_ = usage;
  }
  // Appends a PENDING job to the queue.
  void Enqueue(Request request);
  // Puts a RECOVERING job at the head of the queue: a job that already ran
  // goes before the jobs that wait for their first placement.
  void Requeue(Request request);
  // The queued job's class rank (a priority change); false if not queued.
  bool SetRank(const std::string& job_id, int rank);
  // Drops a job from the queue; false if it was not queued.
  bool Remove(const std::string& job_id);
  bool Queued(const std::string& job_id) const;
  size_t size() const { return queue_.size(); }

  struct Placement {
    std::string job_id;
    std::vector<std::string> workers;  // by stage; already claimed in the registry
    bool profile = false;
  };
  struct Waiting {
    std::string job_id;
    std::string reason;  // "waiting for N idle workers (I idle, R registered)"
    // What it waits for: idle workers (which a preemption could free), its
    // owner's quota, or a waiting job of a higher class. (A recovering job
    // settling after a loss is not listed: it keeps its reason.)
    enum class For { kWorkers, kQuota, kHigherClass };
    For waits_for = For::kWorkers;
    int workers = 0;  // the workers it asks for
    int rank = 0;
  };
  struct Round {
    std::vector<Placement> placed;  // in queue order, removed from the queue
    std::vector<Waiting> waiting;   // still queued
  };
  // One pass over the queue (FIFO with backfill); requests whose not_before
  // is after `now` keep their place and are skipped.
  Round Schedule(absl::Time now);
  // When a request the last pass skipped for its not_before becomes due
  // (InfiniteFuture: none): the owner runs a pass then.
  absl::Time NextDue() const { return next_due_; }

  // The PROFILING step: one worker (workers of a job share a device type)
  // profiles the model; its ProfileResult leads to PlanFromProfile.
  static v1::Command ProfileCommand(const std::string& job_id, const std::string& job_spec_yaml);

  // Stage ranges and block modes from a worker's profile, and the plan as
  // JobStatus.summary entries (planner::PlanSummary).
  struct PlannedStages {
    // Ranges and modes per stage; backprop's schedule: auto: the planner's
    // pick; per stage the formats it sends with (transport's `compression:
    // auto` resolved by the plan; fixed directions as the spec says).
    Cut cut;
    std::vector<std::pair<std::string, double>> summary;
  };
  // Caps: stages.memory_budget, else every worker's --memory-bytes when all
  // of them report one. `ranges`: the job's resolved partition, kept unless
  // stages.partition is auto. Errors name the profile or the plan.
  // `per_worker` (placement.per_worker_profiles): every worker's profile by
  // worker id; stage j is planned on the one of the worker in slot j.
  absl::StatusOr<PlannedStages> PlanFromProfile(
      const JobSpec& spec, const std::vector<std::pair<int, int>>& ranges,
      const v1::ProfileResult& result, const std::vector<std::string>& workers,
      const std::map<std::string, v1::ProfileResult>* per_worker = nullptr) const;

  // Every stage's StageAssignment (command ids unset), one per worker: with
  // `replicas` R, workers by slot (replica r's stage j at r * J + j, J =
  // workers / R), each pointing at the next stage of its own replica and
  // naming the certificate identities of its neighbours; each carries its
  // stage's part of `cut` (blocks, modes, and what the plan chose).
  std::vector<v1::Command> StageAssignments(const std::string& job_id,
                                            const std::string& job_spec_yaml,
                                            const std::vector<std::string>& workers, const Cut& cut,
                                            int replicas = 1) const;

 private:
  // The order of one pass: indices into queue_.
  std::vector<size_t> Order(absl::Time now) const;
  // Claims the request's workers (all, or fewer replicas / stages), within
  // `limit` workers; empty when none fits.
  std::vector<std::string> ClaimFor(const Request& request, int limit);
  // "" when the owner may take `workers` more; else what holds it back.
  std::string QuotaBlock(const Request& request) const;
  std::string WaitingText(const Request& request) const;
  // Workers and jobs the owner holds, with this pass's placements (the
  // owner records them in the OwnerUsage only after the pass).
  int Held(const std::string& owner) const;
  int HeldJobs(const std::string& owner) const;

  WorkerRegistry* registry_;
  const SharingConfig* config_ = nullptr;
  const OwnerUsage* usage_ = nullptr;
  int64_t next_seq_ = 1;
  std::map<std::string, std::pair<int, int>> pass_held_;  // owner -> (workers, jobs)
  std::vector<Request> queue_;
  absl::Time next_due_ = absl::InfiniteFuture();
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_SCHEDULER_H_
