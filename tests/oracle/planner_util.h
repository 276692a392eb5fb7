// What the planner oracle and the planner benchmark share: the all-rebuild
// and all-store plans of a job, and the smallest memory cap at which the
// knapsack mixes modes inside a stage.
#ifndef STAGEWISE_TESTS_ORACLE_PLANNER_UTIL_H_
#define STAGEWISE_TESTS_ORACLE_PLANNER_UTIL_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "services/common/status_macros.h"
#include "services/models/plan.h"
#include "services/planner/planner.h"

namespace stagewise::testing {

// planner::PlanOptionsForJob with the job's own resolved partition.
inline absl::StatusOr<planner::PlanOptions> JobPlanOptions(const JobSpec& spec) {
  STAGEWISE_ASSIGN_OR_RETURN(auto blocks, models::PlanModel(spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(auto ranges, models::ResolvePartition(spec.stages, blocks));
  return planner::PlanOptionsForJob(spec, ranges);
}

struct ModeExtremes {
  planner::Plan rebuild;  // every reversible block rebuilds
  planner::Plan store;    // every block stores
  planner::Plan mixed;    // the knapsack's plan under `cap`
  int64_t cap = 0;        // bytes per worker
};

// The cap is the first of lo + (hi - lo) k / 20, k = 1..19 (lo, hi: the
// largest stage peak with every block rebuilding / storing) where some stage
// stores and rebuilds reversible blocks with a peak strictly between its own
// two extremes. NOT_FOUND when there is none.
inline absl::StatusOr<ModeExtremes> FindModeMix(const planner::ModelProfile& profile,
                                                planner::PlanOptions options) {
  ModeExtremes out;
  options.modes = BlockModes::kRebuild;
  auto low = planner::MakePlan(profile, options);
  if (!low.ok()) return low.status();
  options.modes = BlockModes::kStore;
  auto high = planner::MakePlan(profile, options);
  if (!high.ok()) return high.status();
  out.rebuild = *low;
  out.store = *high;
  int64_t lo = 0, hi = 0;
  for (size_t j = 0; j < low->stages.size(); ++j) {
    lo = std::max(lo, low->stages[j].estimate.peak_bytes);
    hi = std::max(hi, high->stages[j].estimate.peak_bytes);
  }
  options.modes = BlockModes::kAuto;
  for (int k = 1; k < 20; ++k) {
    options.memory_caps = {lo + (hi - lo) * k / 20};
    auto plan = planner::MakePlan(profile, options);
    if (!plan.ok()) continue;
    for (size_t j = 0; j < plan->stages.size(); ++j) {
      const planner::StagePlan& s = plan->stages[j];
      int stored = 0, rebuilt = 0;
      for (int i = s.begin; i < s.end; ++i) {
        if (profile.blocks[i].reversible) (s.store[i - s.begin] ? stored : rebuilt)++;
      }
      if (stored > 0 && rebuilt > 0 && s.estimate.peak_bytes > low->stages[j].estimate.peak_bytes &&
          s.estimate.peak_bytes < high->stages[j].estimate.peak_bytes) {
        out.mixed = *plan;
        out.cap = options.memory_caps[0];
        return out;
      }
    }
  }
  return absl::NotFoundError("no memory cap makes a stage mix store and rebuild");
}

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_ORACLE_PLANNER_UTIL_H_
