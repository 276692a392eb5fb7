// Priority preemption (docs/operations.md, "Sharing the cluster"): a job of
// a class that preempts, waiting for idle workers, takes them from running
// jobs of lower classes through the planned stop (coordinator/planned_stop.h):
// each victim checkpoints at its next step boundary, its attempt ends with
// END_CAUSE_PRIORITY (planned: not counted against recovery.max_restarts)
// and it goes back to the queue, behind the job it made room for, to resume
// from that checkpoint. A victim that may run smaller (recovery.elastic, or
// recovery.min_stages) is counted for the workers above its smallest size
// only: it comes back on what the waiting job leaves.
//
// Victims: running jobs that keep checkpoints, of a lower class, lowest
// class first and, within a class, the most recently started first (the
// least work since their last checkpoint is at stake); only as many as free
// enough workers, and none when all of them together would not. A job for
// which stops are under way is not given more until they end.
//
// Acts through JobHost and PlannedStops; reads the registry. Unit-tested
// with a fake host. Threading: the loop thread only.
#ifndef STAGEWISE_COORDINATOR_PREEMPTION_H_
#define STAGEWISE_COORDINATOR_PREEMPTION_H_

#include <string>
#include <vector>

#include "coordinator/job_host.h"
#include "coordinator/live_job.h"
#include "coordinator/planned_stop.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"
#include "services/spec/sharing.h"

namespace stagewise::coordinator {

// The job's class rank under `config`: its status's class (a priority
// change), else its spec's `priority`, else (neither is a class there any
// more) the default class's.
int RankOfJob(const SharingConfig& config, const LiveJob& job);

class Preemptor {
 public:
  Preemptor(JobHost* host, PlannedStops* planned, const WorkerRegistry* registry)
      : host_(host), planned_(planned), registry_(registry) {}
  // Outlives the preemptor; null: no preemption.
  void set_config(const SharingConfig* config) { config_ = config; }

  // After a scheduling pass, for its waiting jobs (in queue order): begins
  // the planned stops that free the workers of those waiting for idle
  // workers. The number of stops begun.
  int AfterPass(const std::vector<Scheduler::Waiting>& waiting);

 private:
  struct Victim {
    std::string job_id;
    int rank = 0;
    absl::Time started;
    int frees = 0;  // workers it gives up (matching the waiting job's labels)
  };
  // Running jobs of classes below `rank` that a planned stop can take
  // workers from, in the order they are taken.
  std::vector<Victim> Candidates(int rank, const std::vector<std::string>& labels);
  // Workers of planned stops under way for `job_id`.
  int Freeing(const std::string& job_id);

  JobHost* const host_;
  PlannedStops* const planned_;
  const WorkerRegistry* const registry_;
  const SharingConfig* config_ = nullptr;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_PREEMPTION_H_
