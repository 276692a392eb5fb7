// recovery.replay (docs/fault_tolerance.md, "Replacing one stage"): a lost
// worker's stage starts again on an idle worker inside the running attempt,
// and the other stages redo nothing.
//
// 1. TryReplace (the worker was lost): an idle worker with the job's labels
//    gets the stage's StageAssignment with `replacing` and the stage's shard
//    of the newest committed checkpoint (or the attempt's start). A lost
//    replica (stages.replicas > 1) instead copies a surviving replica's live
//    state (StageAssignment.replica_source), and the stage's surviving
//    replicas form their group again with it (ReplicaRegroup).
// 2. Once it acknowledged, the lost stage's neighbours learn where it runs
//    now (NeighbourReplaced); once they acknowledged, it starts. It dials
//    stage j+1, stage j-1 dials it, each side resends what the other does
//    not hold (worker/neighbour_link.h), and it replays until it is where the
//    lost stage was (ReplayDone).
// 3. The job's step passing where it was at the loss ends the replacement
//    (its time to full speed).
// It falls back to the rollback (JobRecovery) when it cannot: no idle
// worker, a replacement already under way, a job that is not RUNNING.
//
// Acts through JobHost and the registry; the loop thread only.
#ifndef STAGEWISE_COORDINATOR_STAGE_REPLACEMENT_H_
#define STAGEWISE_COORDINATOR_STAGE_REPLACEMENT_H_

#include <optional>
#include <string>

#include "absl/random/random.h"
#include "coordinator/job_host.h"
#include "coordinator/live_job.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"

namespace stagewise::coordinator {

class StageReplacer {
 public:
  StageReplacer(JobHost* host, WorkerRegistry* registry, const Scheduler* scheduler)
      : host_(host), registry_(registry), scheduler_(scheduler) {}

  // `lost_worker` of the job is gone (`why`): true when its stage is being
  // replaced; false when the job must recover the usual way.
  bool TryReplace(const std::string& job_id, LiveJob& job, const std::string& lost_worker,
                  const std::string& why);
  // An acknowledgement: true when it was one of a replacement's commands.
  bool OnAck(int64_t command_id, const std::string& sender);
  // The replacing stage caught up.
  void OnReplayDone(LiveJob& job, int stage, const v1::ReplayDone& done);
  // The job's status moved: the replacement ends once its step passed the
  // one at the loss.
  void OnProgress(LiveJob& job);

 private:
  // Where stage slot `slot` restarts: its shard of the newest committed
  // checkpoint on the job's cut, or a newer shard of its own not committed
  // yet; none: the attempt's start.
  std::optional<v1::ResumePoint> ResumeFrom(const std::string& job_id, const LiveJob& job,
                                            int slot) const;
  v1::StageReplacement* Entry(LiveJob& job, int stage);

  absl::BitGen bitgen_;  // copy tokens
  JobHost* const host_;
  WorkerRegistry* const registry_;
  const Scheduler* const scheduler_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_STAGE_REPLACEMENT_H_
