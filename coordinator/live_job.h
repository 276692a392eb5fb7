// A live job (PENDING, PROFILING, CONFIGURING, RUNNING, RECOVERING) as the
// coordinator's loop thread holds it, and how one is made: from a submitted
// spec (PrepareSubmission + MakeLiveJob) or from the store after a restart
// (RestoreLiveJob). Plain data: every unit that works on live jobs
// (JobManager, JobRecovery, CheckpointCommitter, AdmitEvent) sees the same
// struct, on the loop thread only.
#ifndef STAGEWISE_COORDINATOR_LIVE_JOB_H_
#define STAGEWISE_COORDINATOR_LIVE_JOB_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/cut.h"
#include "coordinator/goodput.h"
#include "coordinator/store.h"
#include "services/checkpoint/checkpoint.h"
#include "services/common/path_policy.h"
#include "services/models/block_info.h"
#include "services/spec/job_spec.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

// What an attempt ended on purpose hands to the next one (a planned stop's
// payload, coordinator/planned_stop.h).
struct Handover {
  // recovery.min_stages: the next attempt is cut into this many stages (0:
  // the checkpoint's cut).
  int grow_to = 0;
  // recovery.min_stages: the next placement may take fewer stages at once
  // (a job preempted for a higher class resumes on what is left).
  bool fewer_stages = false;
  // Stopped to make room (a higher class took its workers): it waits for
  // workers as long as it takes, as a new job does (no recovery.wait_seconds).
  bool wait_unbounded = false;
  // Rebalancing (coordinator/rebalancer.h): the cut the next attempt takes.
  struct Recut {
    Cut cut;
    std::vector<std::pair<std::string, double>> summary;  // the new plan's plan.* entries
  };
  std::optional<Recut> recut;
};

// Everything that lives and dies with one attempt of a job: from its
// placement (the workers) to its end. Ending an attempt drops it
// (`job.attempt = {}`); nothing of it is reset field by field.
struct Attempt {
  std::vector<std::string> workers;  // by slot, once placed
  // Replicas of every stage: stages.replicas, or fewer when
  // recovery.elastic placed the attempt short of workers (0 until placed:
  // the spec's).
  int replicas = 0;
  std::map<int64_t, std::string> pending_acks;             // command id -> the worker it went to
  absl::Time configure_deadline = absl::InfiniteFuture();  // CONFIGURING: recover after
  absl::Time started;                                      // when it began RUNNING
  std::set<int> finished_stages;
  std::map<int, std::set<int>> phase_done;  // phase -> stages that finished it
  // Shards reported for checkpoints not committed yet: step -> stage -> report.
  std::map<int64_t, std::map<int, v1::CheckpointSaved>> shards;
  // The stall watchdog (recovery.stall_seconds): when the attempt last made
  // progress (a new step, an evaluation, a finished phase) and the step then.
  absl::Time progressed = absl::InfiniteFuture();  // InfiniteFuture: not running
  int64_t progressed_step = 0;
  int64_t evaluated_step = -1;  // the step of the last evaluation counted as progress
  // A planned stop (coordinator/planned_stop.h): the attempt checkpoints at
  // `step` (-1 until stage 0 picks it), then ends with `cause` and the job
  // resumes from that checkpoint with `handover`; dropped when not
  // committed by `deadline`.
  struct PlannedStop {
    std::string reason;
    v1::EndCause cause = v1::END_CAUSE_UNSPECIFIED;
    Handover handover;
    int64_t step = -1;
    absl::Time deadline = absl::InfiniteFuture();
    // END_CAUSE_PRIORITY: the waiting job the workers go to.
    std::string for_job = {};
  };
  std::optional<PlannedStop> planned_stop;
  // Rebalancing (coordinator/rebalancer.h): per stage its latest (global
  // step, cumulative compute seconds) reports, and the step from which the
  // slowest stage has been over the threshold (-1: it is not).
  std::vector<std::deque<std::pair<int64_t, double>>> stage_compute;
  int64_t imbalanced_since = -1;
  // recovery.min_stages: since when idle workers could take more stages.
  absl::Time grow_possible_since = absl::InfiniteFuture();
  // recovery.replay (coordinator/stage_replacement.h): the stage being
  // replaced, until the job runs at full speed again.
  struct Replacement {
    int slot = -1;
    std::string worker;                // the spare
    int64_t configure_id = 0;          // its StageAssignment's command
    std::set<int64_t> neighbour_acks;  // NeighbourReplaced not acknowledged yet
    bool started = false;              // the spare was told to start
    absl::Time lost = absl::InfinitePast();
    int64_t job_step = 0;  // the job's step when the worker was lost
  };
  std::optional<Replacement> replacement;
  // Replicated stages: how often each stage's replica group was formed again
  // around a replacement (ReplicaRegroup.generation), by stage.
  std::map<int, int> replica_generations;
  // Goodput (coordinator/goodput.h): where this attempt's worker-seconds go.
  AttemptUse use;
};

// A live job: its record (status, spec, the cut and plan the next attempt
// takes, what outlives every attempt) plus its running attempt (`attempt`).
struct LiveJob {
  v1::JobStatus status;  // the latest status (the store has it once flushed)
  JobSpec spec;
  std::string yaml;
  // The cut the running or next attempt takes (ranges, modes, and what the
  // plan chose: schedule, wire formats, in-flight depths).
  Cut cut;
  // The planner (PROFILING): a worker profiles the model, then the cut
  // comes from the plan.
  bool needs_plan = false;
  bool planned = false;
  // placement.per_worker_profiles, while PROFILING: each worker's profile
  // so far (worker id -> ProfileResult); the plan waits for all of them.
  // They outlive attempts: rebalancing re-plans on them.
  std::map<std::string, v1::ProfileResult> profiles;
  // Fault tolerance (docs/fault_tolerance.md).
  int attempt_number = 0;  // mirrors status.attempt; events of other attempts are dropped
  absl::Time recovery_deadline = absl::InfiniteFuture();  // RECOVERING: fail after
  absl::Time attempt_ended = absl::InfinitePast();        // for the recovery time
  int64_t max_step = 0;                                   // the furthest step any attempt reached
  std::optional<checkpoint::Committed> resume;            // what the next attempt loads
  // What the attempt that ended on purpose hands to the next one.
  Handover next;
  // The recent seconds per step (at most kStepSamples) over every attempt:
  // the stall watchdog's automatic limit.
  static constexpr size_t kStepSamples = 256;
  std::deque<double> step_seconds;
  double median_step_seconds = 0;  // of step_seconds, updated with it
  // recovery.min_stages: the recovery deadline passed short of workers for
  // every stage; the next placement may take fewer (FewerStageCounts).
  bool fewer_stages = false;
  // Rebalancing: when the job was rebalanced (rebalance.max_per_hour).
  std::deque<absl::Time> rebalanced_at;
  // Goodput: the worker-seconds of the attempts that ended (as
  // JobStatus.summary's goodput.* entries), and since when the job waits in
  // the queue (InfiniteFuture: it does not).
  WorkerSecondsByUse used;
  absl::Time queued_since = absl::InfiniteFuture();
  // The running attempt (empty while PENDING or RECOVERING).
  Attempt attempt;
};

// Replicated stages (stages.replicas, docs/replicas.md): `workers` holds
// J x R workers by slot, replica r's stage j at r * J + j, so that replica 0
// is the first J (R = 1: by stage, as before).
inline int NumStages(const LiveJob& job) { return job.cut.num_stages(); }
inline int SpecReplicas(const LiveJob& job) { return std::max(1, job.spec.stages.replicas); }
inline int NumReplicas(const LiveJob& job) {
  return job.attempt.replicas > 0 ? job.attempt.replicas : SpecReplicas(job);
}
// recovery.elastic: the replica counts below the spec's a recovering job may
// run with, most first; each divides batch_size so every replica keeps an
// equal share of the same global batch. Empty without elastic.
inline std::vector<int> ElasticReplicaCounts(const LiveJob& job) {
  std::vector<int> counts;
  if (!job.spec.recovery.elastic) return counts;
  for (int r = SpecReplicas(job) - 1; r >= 1; --r) {
    if (job.spec.batch_size % r == 0) counts.push_back(r);
  }
  return counts;
}
// recovery.min_stages: the stage counts below the job's its next placement
// may take, most first (J-1 down to min_stages); empty unless
// job.fewer_stages.
inline std::vector<int> FewerStageCounts(const LiveJob& job) {
  std::vector<int> counts;
  if (!job.fewer_stages) return counts;
  for (int s = NumStages(job) - 1; s >= job.spec.recovery.min_stages; --s) {
    if (s >= 1) counts.push_back(s);
  }
  return counts;
}
// transport's `compression: auto` as planned, for a progress line:
// "; compression auto: stage 0 forward int4; stage 1 backward bf16, ..."
// (empty when the job fixes both directions or nothing was chosen).
std::string AutoWireText(const LiveJob& job);
// Cuts the job into `count` stages (balanced, whatever stages.partition
// says); block modes follow their blocks. The cut as text ("[0,5) [5,10)").
absl::StatusOr<std::string> CutStages(LiveJob& job, int count);
// CutStages for an attempt placed on fewer workers than stages
// (recovery.min_stages). What to tell the user.
absl::StatusOr<std::string> CutFewerStages(LiveJob& job, int count);
inline int SlotOf(const LiveJob& job, int stage, int replica) {
  return replica * NumStages(job) + stage;
}
// Interleaved 1F1B (stages.chunks_per_worker = v > 1): the S = J x v virtual
// stages are the job's stages (ranges, slots, shards, events); worker j of a
// pipeline holds virtual stages j, j + J, ..., so `workers` names it v times.
inline int ChunksPerWorker(const LiveJob& job) {
  return std::max(1, job.spec.stages.chunks_per_worker);
}
// The workers of one pipeline: J.
inline int NumWorkerStages(const LiveJob& job) {
  return std::max(1, NumStages(job) / ChunksPerWorker(job));
}
// placement.labels, plus kNeedsCudaLabel for a job on a GPU: the labels a
// worker of the job must carry.
std::vector<std::string> PlacementLabels(const JobSpec& spec);
// Where stage slot `slot` resumes from the committed checkpoint `from`: its
// own shard, or on another cut every shard holding some of its blocks.
v1::ResumePoint ResumeFor(const LiveJob& job, const checkpoint::Committed& from, int slot);
// The claimed workers (J x R distinct ones, replica r's j-th at r * J + j)
// spread over the slots: slot r * S + s is claimed[r * J + s % J].
std::vector<std::string> SlotWorkers(const LiveJob& job, const std::vector<std::string>& claimed);
// Every worker of `job.attempt.workers` once, in slot order: where a command goes to
// a worker rather than to a stage (start, stop).
std::vector<std::string> DistinctWorkers(const LiveJob& job);

// How long the running job may go without progress: recovery.stall_seconds,
// or 20x the median of step_seconds, at least 300 s.
absl::Duration StallLimit(const LiveJob& job);
// When the running job counts as stalled (InfiniteFuture when it is not
// running).
absl::Time StallDeadline(const LiveJob& job);
// The job made progress at `now`; `step` >= 0 is its new step (-1: progress
// without a step, such as an evaluation).
void NoteProgress(LiveJob& job, int64_t step, absl::Time now);

// A submitted (parsed) spec, checked as far as the coordinator can without a
// worker: its model planned and partitioned, its length known, its
// checkpoint.dir inside `checkpoint_roots` and writable from here.
struct Submission {
  JobSpec spec;
  std::vector<models::BlockInfo> blocks;
  // The spec's partition resolved, with the block modes it fixes (none
  // while the plan is to choose them).
  Cut cut;
  int64_t steps_per_epoch = 0;
};
absl::StatusOr<Submission> PrepareSubmission(JobSpec spec, const PathRoots& checkpoint_roots);

// The PENDING status a prepared submission starts with (no id yet).
v1::JobStatus InitialStatus(const Submission& submission, const std::string& owner);

// A new live job on the submission's cut; needs_plan follows from the spec.
LiveJob MakeLiveJob(const v1::JobStatus& status, const Submission& submission,
                    const std::string& yaml);

// A stage's MetricsReport applied to the job's status: the last stage's
// training loss moves the step, epoch, reached step and throughput, any
// stage's evaluation the eval results. The metric points to record (none when
// the report changes nothing shown).
std::vector<MetricPoint> ApplyMetrics(LiveJob& job, int stage, const v1::MetricsReport& report,
                                      absl::Time now);
// A placement's workers (by slot) set the attempt's replicas, in the job and
// its status. What to tell the user when recovery.elastic placed fewer than
// the spec's replicas ("" otherwise).
std::string SetPlacedReplicas(LiveJob& job);
// A report of replica r > 0's stage (replica 0's goes to ApplyMetrics, which
// records its share too): its last stage's training loss sets the replica's
// entry of JobStatus.replica_samples_per_second. Nothing else moves.
void ApplyReplicaMetrics(LiveJob& job, int stage, int replica, const v1::MetricsReport& report,
                         absl::Time now);
// A stage's StageResult: its values become summary entries "stage<j>.<key>".
std::vector<MetricPoint> ApplyResult(LiveJob& job, int stage, const v1::StageResult& result,
                                     absl::Time now);

// The live job of an unfinished record after a coordinator restart, with its
// attempt and the furthest step it reached; the error says why it cannot be
// run again (its spec no longer parses or plans).
absl::StatusOr<LiveJob> RestoreLiveJob(const JobRecord& record);

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_LIVE_JOB_H_
