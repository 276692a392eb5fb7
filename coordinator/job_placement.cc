#include "coordinator/job_placement.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/check.h"
#include "services/common/log.h"
#include "services/common/status_macros.h"

namespace stagewise::coordinator {

void JobPlacer::PassIfNeeded() {
  STAGEWISE_BUG(OnLoop());
  if (!needed_) return;
  needed_ = false;
  Pass();
}

void JobPlacer::Pass() {
  STAGEWISE_BUG(OnLoop());
  Scheduler::Round round = parts_.scheduler->Schedule(absl::Now());
  // The jobs still queued, in queue order: what each waits for, and its
  // place (`stagewise queue`); only a new reason is an event.
  int position = 0;
  for (const Scheduler::Waiting& w : round.waiting) {
    ++position;
    LiveJob* job = host_->FindJob(w.job_id);
    if (job == nullptr) continue;
    v1::JobStatus& st = job->status;
    // recovery.wait_seconds counts a shortage of workers only, not a quota
    // or a higher class holding them.
    if (st.state() == v1::RECOVERING && w.waits_for != Scheduler::Waiting::For::kWorkers &&
        job->recovery_deadline != absl::InfiniteFuture()) {
      job->recovery_deadline = std::max(
          job->recovery_deadline, absl::Now() + absl::Seconds(job->spec.recovery.wait_seconds));
    }
    const bool new_reason = st.reason() != w.reason;
    if (!new_reason && st.queue_position() == position) continue;
    st.set_reason(w.reason);
    st.set_queue_position(position);
    host_->UpdateProgress(*job, new_reason ? w.reason : "", {});
  }
  for (const Scheduler::Placement& p : round.placed) Place(p);
  // Priority classes: waiting jobs take workers from lower classes.
  parts_.preemptor->AfterPass(round.waiting);
  // recovery.min_stages: a job that shrank takes idle workers back, while no
  // other job waits for them.
  if (parts_.scheduler->size() == 0) MaybeGrow();
}

void JobPlacer::Place(const Scheduler::Placement& p) {
  LiveJob* placed = host_->FindJob(p.job_id);
  if (placed == nullptr) {
    parts_.registry->Release(p.job_id);
    return;
  }
  const int workers = static_cast<int>(p.workers.size());
  std::string fewer;  // recovery.min_stages: placed on fewer workers than stages
  if (!p.profile && placed->fewer_stages && workers < NumStages(*placed)) {
    absl::StatusOr<std::string> cut = CutFewerStages(*placed, workers);
    if (!cut.ok()) {
      host_->EndJob(p.job_id, v1::FAILED,
                    absl::StrCat("recovery.min_stages: ", cut.status().message()));
      return;
    }
    fewer = *cut;
    STAGEWISE_LOG(WARNING) << "job " << p.job_id << ": " << fewer;
  }
  placed->fewer_stages = false;
  if (placed->status.queue_position() != 0) {
    placed->status.set_queue_position(0);
    host_->UpdateProgress(*placed, "", {});  // stored with the transition's flush
  }
  placed->attempt.workers = SlotWorkers(*placed, p.workers);
  int gpu_workers = 0;
  for (const std::string& w : p.workers) {
    const std::optional<v1::WorkerInfo> info = parts_.registry->Info(w);
    gpu_workers += info && HasLabels(*info, {kNeedsCudaLabel}) ? 1 : 0;
  }
  parts_.usage->Hold(p.job_id, placed->status.owner(), workers, absl::Now(), gpu_workers);
  parts_.goodput->Placed(*placed, workers, absl::Now());
  std::string elastic = SetPlacedReplicas(*placed);
  if (elastic.empty()) elastic = fewer;
  if (!elastic.empty()) STAGEWISE_LOG(WARNING) << "job " << p.job_id << ": " << elastic;
  auto moved = host_->Transition(p.job_id, p.profile ? v1::PROFILING : v1::CONFIGURING, elastic);
  if (!moved.ok()) {
    host_->EndJob(p.job_id, v1::FAILED,
                  absl::StrCat("cannot record the placement: ", moved.status().message()));
    return;
  }
  LiveJob& job = *host_->FindJob(p.job_id);
  if (!p.profile) {
    Configure(p.job_id, job);
    return;
  }
  // placement.per_worker_profiles: every worker measures its own times.
  const std::vector<std::string> profilers = job.spec.placement.per_worker_profiles
                                                 ? DistinctWorkers(job)
                                                 : std::vector<std::string>{p.workers.front()};
  for (const std::string& w : profilers)
    host_->Send(w, Scheduler::ProfileCommand(p.job_id, job.yaml));
}

void JobPlacer::MaybeGrow() {
  STAGEWISE_BUG(OnLoop());
  for (const std::string& id : host_->LiveJobIds()) {
    LiveJob& job = *host_->FindJob(id);
    if (job.spec.recovery.min_stages == 0 || job.status.state() != v1::RUNNING ||
        job.attempt.planned_stop) {
      continue;
    }
    const int have = NumStages(job);
    const int to = std::min(job.spec.stages.count,
                            have + parts_.registry->IdleWith(PlacementLabels(job.spec)));
    if (to <= have) {
      job.attempt.grow_possible_since = absl::InfiniteFuture();
      continue;
    }
    // All the stages at once; fewer once they stayed that few for
    // recovery.wait_seconds (workers that restart together come one by one).
    const absl::Time now = absl::Now();
    if (job.attempt.grow_possible_since == absl::InfiniteFuture())
      job.attempt.grow_possible_since = now;
    if (to < job.spec.stages.count &&
        now - job.attempt.grow_possible_since < absl::Seconds(job.spec.recovery.wait_seconds)) {
      continue;
    }
    job.attempt.grow_possible_since = absl::InfiniteFuture();
    Handover handover;
    handover.grow_to = to;
    (void)parts_.planned->Begin(
        id, job,
        absl::StrCat(to - have, " idle worker(s): growing from ", have, " to ", to, " stages"),
        v1::END_CAUSE_GROW, std::move(handover));
  }
}

void JobPlacer::Configure(const std::string& job_id, LiveJob& job) {
  std::vector<v1::Command> commands = parts_.scheduler->StageAssignments(
      job_id, job.yaml, job.attempt.workers, job.cut, NumReplicas(job));
  for (v1::Command& c : commands) c.mutable_configure()->set_replay(job.spec.recovery.replay);
  job.recovery_deadline = absl::InfiniteFuture();
  job.attempt.configure_deadline = absl::Now() + parts_.configure_timeout;
  parts_.recovery->BeginAttempt(job, &commands);
  host_->UpdateProgress(job, "", {});
  // A claimed worker whose control stream ended since it was claimed has left
  // the registry (its stage would get no next_address and fail as a bad
  // assignment, which would fail the job). The lost-worker task already
  // queued ends this attempt and recovers the job; send nothing meanwhile.
  for (const std::string& worker : job.attempt.workers) {
    if (!parts_.registry->Info(worker).has_value()) {
      STAGEWISE_LOG(WARNING) << "job " << job_id << " attempt " << job.attempt_number << ": worker "
                             << worker << " left before its stage was configured";
      return;
    }
  }
  for (size_t j = 0; j < commands.size(); ++j) {
    commands[j].mutable_configure()->set_attempt(job.attempt_number);
    commands[j].set_command_id(host_->NewCommandId());
    job.attempt.pending_acks.emplace(commands[j].command_id(), job.attempt.workers[j]);
    host_->Send(job.attempt.workers[j], std::move(commands[j]));
  }
}

void JobPlacer::OnProfile(const std::string& job_id, const v1::ProfileResult& result,
                          const std::string& sender) {
  STAGEWISE_BUG(OnLoop());
  LiveJob* profiled = host_->FindJob(job_id);
  if (profiled == nullptr || profiled->planned) return;
  LiveJob& job = *profiled;
  if (job.spec.placement.per_worker_profiles) {
    // Every worker profiles; the plan waits for the last of them.
    job.profiles[sender] = result;
    const std::vector<std::string> all = DistinctWorkers(job);
    const size_t have = job.profiles.size();
    if (have < all.size()) {
      host_->UpdateProgress(job, absl::StrCat("profiled on ", have, " of ", all.size(), " workers"),
                            {});
      return;
    }
  }
  auto planned = parts_.scheduler->PlanFromProfile(
      job.spec, job.cut.ranges, result, job.attempt.workers,
      job.spec.placement.per_worker_profiles ? &job.profiles : nullptr);
  if (!planned.ok()) {
    host_->EndJob(job_id, v1::FAILED, std::string(planned.status().message()));
    return;
  }
  job.planned = true;
  job.cut = std::move(planned->cut);
  auto& summary = *job.status.mutable_summary();
  for (const auto& [key, value] : planned->summary) summary[key] = value;
  summary["plan.profile_cached"] = result.cached() ? 1 : 0;
  if (job.spec.placement.per_worker_profiles) {
    summary["plan.worker_profiles"] = static_cast<double>(job.profiles.size());
  }
  host_->UpdateProgress(
      job,
      absl::StrCat(job.cut.schedule.has_value()
                       ? absl::StrCat("planned: schedule ", NameOf(*job.cut.schedule))
                       : "planned",
                   AutoWireText(job)),
      {});
  // Transition writes the plan first, then the state.
  if (!host_->Transition(job_id, v1::CONFIGURING, "").ok()) return;
  if (LiveJob* configured = host_->FindJob(job_id)) Configure(job_id, *configured);
}

void JobPlacer::Requeue(const std::string& job_id, bool recovering) {
  STAGEWISE_BUG(OnLoop());
  LiveJob* queued = host_->FindJob(job_id);
  if (queued == nullptr) return;
  const LiveJob& job = *queued;
  // Submitted suspended: outside the queue until Release.
  if (job.status.suspended()) return;
  // Every placement asks for all the spec's replicas; a recovering elastic
  // job takes fewer when that many are not idle.
  parts_.goodput->Queued(*queued, absl::Now());
  Scheduler::Request request{job_id, NumWorkerStages(job) * SpecReplicas(job),
                             job.needs_plan && !job.planned};
  request.stages = NumWorkerStages(job);
  request.distinct_identities = job.spec.placement.distinct_identities;
  request.labels = PlacementLabels(job.spec);
  request.owner = job.status.owner();
  request.rank = RankOfJob(*parts_.sharing, job);
  if (recovering) {
    request.fewer_replicas = ElasticReplicaCounts(job);
    request.fewer_stages = FewerStageCounts(job);
    request.not_before = absl::Now() + parts_.recovery_settle;
    parts_.scheduler->Requeue(std::move(request));
  } else {
    parts_.scheduler->Enqueue(std::move(request));
  }
  needed_ = true;
}

// --- What clients change in the queue ---------------------------------------

absl::StatusOr<v1::JobStatus> JobPlacer::Release(const std::string& job_id, LiveJob& job) {
  STAGEWISE_BUG(OnLoop());
  if (!job.status.suspended()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::JobState_Name(job.status.state()),
                     " and not suspended (it was not submitted with --suspended, or it was "
                     "released already)"));
  }
  // Durable before it is queued: a restart never suspends it again.
  STAGEWISE_RETURN_IF_ERROR(host_->ChangeStatus(job, [](v1::JobStatus& st) {
    st.set_suspended(false);
    st.set_reason("released: waiting for workers");
  }));
  host_->UpdateProgress(job, "released from suspension (stagewise resume); queued", {});
  Requeue(job_id, /*recovering=*/false);
  return job.status;
}

absl::StatusOr<v1::JobStatus> JobPlacer::SetPriority(const std::string& job_id, LiveJob& job,
                                                     const std::string& priority) {
  STAGEWISE_BUG(OnLoop());
  const SharingConfig& sharing = *parts_.sharing;
  absl::StatusOr<int> rank = sharing.RankOf(priority);
  if (!rank.ok() || priority.empty()) {
    return absl::InvalidArgumentError(rank.ok() ? "priority: name a class"
                                                : std::string(rank.status().message()));
  }
  STAGEWISE_RETURN_IF_ERROR(sharing.CheckOpenTo(*rank, job.status.owner()));
  if (!job.attempt.workers.empty() ||
      (job.status.state() != v1::PENDING && job.status.state() != v1::RECOVERING)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "priority: job ", job_id, " is ", v1::JobState_Name(job.status.state()),
        "; the class of a placed job does not change under it (cancel it and submit it again "
        "with `priority: ",
        priority, "`)"));
  }
  const std::string before = job.status.priority();
  const std::string after = sharing.NameOf(*rank);
  // Durable before it acts: a restart keeps the new class.
  STAGEWISE_RETURN_IF_ERROR(
      host_->ChangeStatus(job, [&after](v1::JobStatus& st) { st.set_priority(after); }));
  host_->UpdateProgress(
      job, absl::StrCat("priority: class ", before, " -> ", job.status.priority()), {});
  parts_.scheduler->SetRank(job_id, *rank);
  needed_ = true;
  return job.status;
}

}  // namespace stagewise::coordinator
