#include "coordinator/rebalancer.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/log.h"
#include "services/planner/plan_proto.h"
#include "services/planner/profile.h"

namespace stagewise::coordinator {
namespace {

// The plan's time per mini-batch of stage j (0 when the job has no plan).
double Planned(const LiveJob& job, int j) {
  const auto& summary = job.status.summary();
  const auto it = summary.find(absl::StrCat("plan.stage", j, ".seconds_per_batch"));
  return it == summary.end() ? 0 : it->second;
}

}  // namespace

void Rebalancer::OnComputeTime(const std::string& job_id, LiveJob& job, int stage, int64_t step,
                               double compute_seconds, absl::Time now) {
  const RebalanceSpec& r = job.spec.rebalance;
  if (r.threshold <= 0 || job.status.state() != v1::RUNNING) return;
  const int J = NumStages(job);
  if (stage < 0 || stage >= J) return;
  if (static_cast<int>(job.attempt.stage_compute.size()) != J)
    job.attempt.stage_compute.assign(J, {});
  auto& samples = job.attempt.stage_compute[stage];
  if (!samples.empty() && step <= samples.back().first) return;  // no step since
  samples.emplace_back(step, compute_seconds);
  while (samples.size() > kSamples) samples.pop_front();
  // Each stage's pace (compute seconds per mini-batch) over its plan.
  std::vector<double> over(J, 0);
  for (int j = 0; j < J; ++j) {
    const auto& s = job.attempt.stage_compute[j];
    const double planned = Planned(job, j);
    if (s.size() < 2 || planned <= 0) return;
    const double pace = (s.back().second - s.front().second) /
                        static_cast<double>(s.back().first - s.front().first);
    over[j] = pace / planned;
  }
  auto& summary = *job.status.mutable_summary();
  for (int j = 0; j < J; ++j) summary[absl::StrCat("stage", j, ".pace_over_plan")] = over[j];
  std::vector<double> sorted = over;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[(J - 1) / 2];  // the lower one: with two stages, the other
  const double worst = sorted.back();
  const int64_t at = job.status.step();
  if (median <= 0 || worst < (1 + r.threshold) * median) {
    job.attempt.imbalanced_since = -1;
    return;
  }
  if (job.attempt.imbalanced_since < 0) job.attempt.imbalanced_since = at;
  if (at - job.attempt.imbalanced_since < r.window_steps || job.attempt.planned_stop) return;
  while (!job.rebalanced_at.empty() && now - job.rebalanced_at.front() > absl::Hours(1)) {
    job.rebalanced_at.pop_front();
  }
  if (static_cast<double>(job.rebalanced_at.size()) >= r.max_per_hour) return;
  std::vector<double> slowdown(J);
  for (int j = 0; j < J; ++j) slowdown[j] = over[j] / median;
  Replan(job_id, job, slowdown, now);
}

void Rebalancer::Replan(const std::string& job_id, LiveJob& job,
                        const std::vector<double>& slowdown, absl::Time now) {
  const int J = NumStages(job);
  const double threshold = job.spec.rebalance.threshold;
  auto give_up = [&](const std::string& why) {
    // Not now: look again after another window.
    job.attempt.imbalanced_since = job.status.step();
    STAGEWISE_LOG(WARNING) << "job " << job_id << ": not rebalancing: " << why;
    host_->UpdateProgress(job, absl::StrCat("not rebalancing: ", why), {});
  };
  // Each worker's profile, its times scaled by how much slower it measures.
  std::map<std::string, v1::ProfileResult> scaled;
  for (int j = 0; j < J && j < static_cast<int>(job.attempt.workers.size()); ++j) {
    const std::string& worker = job.attempt.workers[j];
    const auto it = job.profiles.find(worker);
    if (it == job.profiles.end()) return give_up(absl::StrCat("no profile of worker ", worker));
    absl::StatusOr<planner::ModelProfile> p = planner::ProfileFromProto(it->second.profile());
    if (!p.ok()) return give_up(std::string(p.status().message()));
    for (planner::BlockProfile& b : p->blocks) {
      for (double* t : {&b.forward_s, &b.forward_nograd_s, &b.backward_s, &b.rebuild_backward_s,
                        &b.inverse_s, &b.step_s, &b.message_s, &b.aux_head_s}) {
        *t *= slowdown[j];
      }
    }
    v1::ProfileResult result = it->second;
    *result.mutable_profile() = planner::ToProto(*p);
    scaled[worker] = std::move(result);
  }
  if (scaled.empty()) return give_up("the job has no workers");
  absl::StatusOr<Scheduler::PlannedStages> plan = scheduler_->PlanFromProfile(
      job.spec, job.cut.ranges, scaled.begin()->second, job.attempt.workers, &scaled);
  if (!plan.ok()) return give_up(std::string(plan.status().message()));
  // The slowest stage of the current cut at the measured speeds, against the
  // new cut's (the plan's units).
  double current = 0, planned = 0;
  int slowest = 0;
  for (int j = 0; j < J; ++j) {
    const double t = Planned(job, j) * slowdown[j];
    if (t > current) {
      current = t;
      slowest = j;
    }
  }
  for (const auto& [key, value] : plan->summary) {
    if (absl::StartsWith(key, "plan.stage") && absl::EndsWith(key, ".seconds_per_batch")) {
      planned = std::max(planned, value);
    }
  }
  if (plan->cut.ranges == job.cut.ranges || planned <= 0 ||
      planned * (1 + threshold / 2) > current) {
    return give_up(absl::StrFormat("no cut is %.0f%% faster at the measured speeds (%s: %.2fx)",
                                   threshold * 50, plan->cut.Text(),
                                   planned > 0 ? current / planned : 0.0));
  }
  const std::string reason = absl::StrFormat(
      "rebalance: stage %d (worker %s) runs %.2fx its plan against the other stages; the cut %s "
      "predicts %.2fx the speed",
      slowest, job.attempt.workers[slowest], slowdown[slowest], plan->cut.Text(),
      current / planned);
  Handover handover;
  handover.recut = Handover::Recut{plan->cut, plan->summary};
  if (!planned_->Begin(job_id, job, reason, v1::END_CAUSE_REBALANCE, std::move(handover))) return;
  STAGEWISE_LOG(INFO) << "job " << job_id << ": " << reason;
  job.rebalanced_at.push_back(now);
  job.attempt.imbalanced_since = -1;
}

}  // namespace stagewise::coordinator
