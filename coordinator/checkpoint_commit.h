// Commits a job's checkpoints: collects the shards its stages report
// (CheckpointSaved) and, once every stage's shard of a step is durable,
// writes the step's manifest (the commit) and prunes old checkpoints
// (services/checkpoint/checkpoint.h is the on-disk layout).
//
// Threading: the loop thread only. It does its file I/O (a stat per shard,
// the manifest's write and fsync, the prune) on that thread, as a commit is
// rare and small.
#ifndef STAGEWISE_COORDINATOR_CHECKPOINT_COMMIT_H_
#define STAGEWISE_COORDINATOR_CHECKPOINT_COMMIT_H_

#include <cstdint>
#include <string>

#include "coordinator/job_host.h"
#include "coordinator/live_job.h"
#include "services/metrics/metrics.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

class CheckpointCommitter {
 public:
  CheckpointCommitter(JobHost* host, metrics::CoordinatorMetrics* metrics)
      : host_(host), metrics_(metrics) {}

  // Stage `stage` of `job` wrote its shard of the checkpoint after `saved.step()`.
  // Ignored for jobs without checkpoint.dir or stages out of range.
  void OnShardSaved(const std::string& job_id, LiveJob& job, int stage,
                    const v1::CheckpointSaved& saved);

 private:
  // Every shard of `step` reported: writes the manifest, prunes. A failure
  // is logged and shown in the job's progress; the job goes on.
  void Commit(const std::string& job_id, LiveJob& job, int64_t step);

  JobHost* const host_;
  metrics::CoordinatorMetrics* const metrics_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_CHECKPOINT_COMMIT_H_
