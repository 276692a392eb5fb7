// Rebalancing while training (docs/fault_tolerance.md, "Rebalancing"): the
// coordinator watches each stage's compute time per mini-batch against its
// plan. When the slowest stage runs more than rebalance.threshold over the
// median stage (both relative to their plans; the lower median for an even
// count) for rebalance.window_steps
// steps in a row, it re-plans on the workers' profiles scaled by what they
// measure, and if the new cut is worth it (its slowest stage at least
// threshold / 2 faster) it plans a stop (PlannedStops, cause "rebalance"):
// the job checkpoints at its next step boundary and resumes on the new cut,
// the checkpoint resharded.
//
// Each stage's pace over its plan is also written to the job's summary
// (stage<j>.pace_over_plan), for `stagewise status` and the doctor.
//
// Threading: the loop thread only.
#ifndef STAGEWISE_COORDINATOR_REBALANCER_H_
#define STAGEWISE_COORDINATOR_REBALANCER_H_

#include <string>

#include "absl/time/time.h"
#include "coordinator/live_job.h"
#include "coordinator/planned_stop.h"
#include "coordinator/scheduler.h"

namespace stagewise::coordinator {

class Rebalancer {
 public:
  Rebalancer(JobHost* host, PlannedStops* planned, const Scheduler* scheduler)
      : host_(host), planned_(planned), scheduler_(scheduler) {}

  // Stage `stage` has computed `compute_seconds` in this attempt after
  // `step` global steps (MetricsReport "compute_seconds").
  void OnComputeTime(const std::string& job_id, LiveJob& job, int stage, int64_t step,
                     double compute_seconds, absl::Time now);

  // The samples each stage's pace is measured over (its latest reports).
  static constexpr size_t kSamples = 6;

 private:
  void Replan(const std::string& job_id, LiveJob& job, const std::vector<double>& slowdown,
              absl::Time now);

  JobHost* const host_;
  PlannedStops* const planned_;
  const Scheduler* const scheduler_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_REBALANCER_H_
