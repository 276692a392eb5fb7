// JobManager's placement side (loop thread): the scheduling pass, the plan
// from the workers' profiles, the stage assignments, the queue a job goes
// back to, and what clients ask of the queue (release, priority, goodput).
// The rest of the manager is in job_manager.cc.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job_manager.h"
#include "services/common/log.h"
#include "services/common/status_macros.h"

namespace stagewise::coordinator {
// --- Loop thread: lifecycle -------------------------------------------------

void JobManager::ScheduleIfNeeded() {
  if (!schedule_needed_) return;
  schedule_needed_ = false;
  Schedule();
}

void JobManager::Schedule() {
  STAGEWISE_BUG(OnLoop());
  Scheduler::Round round = scheduler_.Schedule(absl::Now());
  // The jobs still queued, in queue order: what each waits for, and its
  // place (`stagewise queue`); only a new reason is an event.
  int position = 0;
  for (const Scheduler::Waiting& w : round.waiting) {
    ++position;
    auto it = jobs_.find(w.job_id);
    if (it == jobs_.end()) continue;
    v1::JobStatus& st = it->second.status;
    // recovery.wait_seconds counts a shortage of workers only, not a quota
    // or a higher class holding them.
    if (st.state() == v1::RECOVERING && w.waits_for != Scheduler::Waiting::For::kWorkers &&
        it->second.recovery_deadline != absl::InfiniteFuture()) {
      it->second.recovery_deadline =
          std::max(it->second.recovery_deadline,
                   absl::Now() + absl::Seconds(it->second.spec.recovery.wait_seconds));
    }
    const bool new_reason = st.reason() != w.reason;
    if (!new_reason && st.queue_position() == position) continue;
    st.set_reason(w.reason);
    st.set_queue_position(position);
    UpdateProgress(it->second, new_reason ? w.reason : "", {});
  }
  for (const Scheduler::Placement& p : round.placed) {
    auto it = jobs_.find(p.job_id);
    if (it == jobs_.end()) {
      registry_.Release(p.job_id);
      continue;
    }
    std::string fewer;  // recovery.min_stages: placed on fewer workers than stages
    if (!p.profile && it->second.fewer_stages &&
        static_cast<int>(p.workers.size()) < NumStages(it->second)) {
      absl::StatusOr<std::string> cut =
          CutFewerStages(it->second, static_cast<int>(p.workers.size()));
      if (!cut.ok()) {
        EndJob(p.job_id, v1::FAILED, absl::StrCat("recovery.min_stages: ", cut.status().message()));
        continue;
      }
      fewer = *cut;
      STAGEWISE_LOG(WARNING) << "job " << p.job_id << ": " << fewer;
    }
    it->second.fewer_stages = false;
    if (it->second.status.queue_position() != 0) {
      it->second.status.set_queue_position(0);
      UpdateProgress(it->second, "", {});  // stored with the transition's flush
    }
    it->second.run.workers = SlotWorkers(it->second, p.workers);
    int gpu_workers = 0;
    for (const std::string& w : p.workers) {
      const std::optional<v1::WorkerInfo> info = registry_.Info(w);
      gpu_workers += info && HasLabels(*info, {kNeedsCudaLabel}) ? 1 : 0;
    }
    usage_.Hold(p.job_id, it->second.status.owner(), static_cast<int>(p.workers.size()),
                absl::Now(), gpu_workers);
    goodput_.Placed(it->second, static_cast<int>(p.workers.size()), absl::Now());
    std::string elastic = SetPlacedReplicas(it->second);
    if (elastic.empty()) elastic = fewer;
    if (!elastic.empty()) STAGEWISE_LOG(WARNING) << "job " << p.job_id << ": " << elastic;
    auto moved = Transition(p.job_id, p.profile ? v1::PROFILING : v1::CONFIGURING, elastic);
    if (!moved.ok()) {
      EndJob(p.job_id, v1::FAILED,
             absl::StrCat("cannot record the placement: ", moved.status().message()));
      continue;
    }
    Job& job = jobs_.at(p.job_id);
    if (p.profile) {
      // placement.per_worker_profiles: every worker measures its own times.
      const std::vector<std::string> profilers = job.spec.placement.per_worker_profiles
                                                     ? DistinctWorkers(job)
                                                     : std::vector<std::string>{p.workers.front()};
      for (const std::string& w : profilers) {
        Send(w, Scheduler::ProfileCommand(p.job_id, job.yaml));
      }
    } else {
      Configure(p.job_id, job);
    }
  }
  // Priority classes: waiting jobs take workers from lower classes.
  preemptor_.AfterPass(round.waiting);
  // recovery.min_stages: a job that shrank takes idle workers back, while no
  // other job waits for them.
  if (scheduler_.size() == 0) MaybeGrow();
}

void JobManager::MaybeGrow() {
  STAGEWISE_BUG(OnLoop());
  for (auto& [id, job] : jobs_) {
    if (job.spec.recovery.min_stages == 0 || job.status.state() != v1::RUNNING ||
        job.run.planned_stop) {
      continue;
    }
    const int have = NumStages(job);
    const int to =
        std::min(job.spec.stages.count, have + registry_.IdleWith(PlacementLabels(job.spec)));
    if (to <= have) {
      job.run.grow_possible_since = absl::InfiniteFuture();
      continue;
    }
    // All the stages at once; fewer once they stayed that few for
    // recovery.wait_seconds (workers that restart together come one by one).
    const absl::Time now = absl::Now();
    if (job.run.grow_possible_since == absl::InfiniteFuture()) job.run.grow_possible_since = now;
    if (to < job.spec.stages.count &&
        now - job.run.grow_possible_since < absl::Seconds(job.spec.recovery.wait_seconds)) {
      continue;
    }
    job.run.grow_possible_since = absl::InfiniteFuture();
    Handover handover;
    handover.grow_to = to;
    (void)planned_.Begin(
        id, job,
        absl::StrCat(to - have, " idle worker(s): growing from ", have, " to ", to, " stages"),
        v1::END_CAUSE_GROW, std::move(handover));
  }
}

void JobManager::Configure(const std::string& job_id, Job& job) {
  STAGEWISE_BUG(OnLoop());
  std::vector<v1::Command> commands = scheduler_.StageAssignments(
      job_id, job.yaml, job.run.workers, job.ranges, job.modes, NumReplicas(job));
  for (v1::Command& c : commands) SetPlanned(job, c.mutable_configure());
  job.recovery_deadline = absl::InfiniteFuture();
  job.run.configure_deadline = absl::Now() + options_.configure_timeout;
  recovery_.BeginAttempt(job, &commands);
  UpdateProgress(job, "", {});
  // A claimed worker whose control stream ended since it was claimed has left
  // the registry (its stage would get no next_address and fail as a bad
  // assignment, which would fail the job). The lost-worker task already
  // queued ends this attempt and recovers the job; send nothing meanwhile.
  for (const std::string& worker : job.run.workers) {
    if (!registry_.Info(worker).has_value()) {
      STAGEWISE_LOG(WARNING) << "job " << job_id << " attempt " << job.attempt << ": worker "
                             << worker << " left before its stage was configured";
      return;
    }
  }
  for (size_t j = 0; j < commands.size(); ++j) {
    commands[j].mutable_configure()->set_attempt(job.attempt);
    commands[j].set_command_id(next_command_++);
    job.run.pending_acks.emplace(commands[j].command_id(), job.run.workers[j]);
    Send(job.run.workers[j], std::move(commands[j]));
  }
}

void JobManager::OnProfile(const std::string& job_id, const v1::ProfileResult& result,
                           const std::string& sender) {
  STAGEWISE_BUG(OnLoop());
  Job& job = jobs_.at(job_id);
  if (job.planned) return;
  if (job.spec.placement.per_worker_profiles) {
    // Every worker profiles; the plan waits for the last of them.
    job.profiles[sender] = result;
    const std::vector<std::string> all = DistinctWorkers(job);
    const size_t have = job.profiles.size();
    if (have < all.size()) {
      UpdateProgress(job, absl::StrCat("profiled on ", have, " of ", all.size(), " workers"), {});
      return;
    }
  }
  auto planned =
      scheduler_.PlanFromProfile(job.spec, job.ranges, result, job.run.workers,
                                 job.spec.placement.per_worker_profiles ? &job.profiles : nullptr);
  if (!planned.ok()) {
    EndJob(job_id, v1::FAILED, std::string(planned.status().message()));
    return;
  }
  job.planned = true;
  job.ranges = std::move(planned->ranges);
  job.modes = std::move(planned->modes);
  job.schedule = planned->schedule;
  job.wire = std::move(planned->wire);
  auto& summary = *job.status.mutable_summary();
  for (const auto& [key, value] : planned->summary) summary[key] = value;
  summary["plan.profile_cached"] = result.cached() ? 1 : 0;
  if (job.spec.placement.per_worker_profiles) {
    summary["plan.worker_profiles"] = static_cast<double>(job.profiles.size());
  }
  UpdateProgress(job,
                 absl::StrCat(job.schedule.has_value()
                                  ? absl::StrCat("planned: schedule ", NameOf(*job.schedule))
                                  : "planned",
                              AutoWireText(job)),
                 {});
  // Transition writes the plan first, then the state.
  if (!Transition(job_id, v1::CONFIGURING, "").ok()) return;
  Configure(job_id, jobs_.at(job_id));
}

void JobManager::Requeue(const std::string& job_id, bool recovering) {
  STAGEWISE_BUG(OnLoop());
  const Job& job = jobs_.at(job_id);
  // Submitted suspended: outside the queue until Release.
  if (job.status.suspended()) return;
  // Every placement asks for all the spec's replicas; a recovering elastic
  // job takes fewer when that many are not idle.
  goodput_.Queued(jobs_.at(job_id), absl::Now());
  Scheduler::Request request{job_id, NumWorkerStages(job) * SpecReplicas(job),
                             job.needs_plan && !job.planned};
  request.stages = NumWorkerStages(job);
  request.distinct_identities = job.spec.placement.distinct_identities;
  request.labels = PlacementLabels(job.spec);
  request.owner = job.status.owner();
  request.rank = RankOfJob(sharing_, job);
  if (recovering) {
    request.fewer_replicas = ElasticReplicaCounts(job);
    request.fewer_stages = FewerStageCounts(job);
    request.not_before = absl::Now() + options_.recovery_settle;
    scheduler_.Requeue(std::move(request));
  } else {
    scheduler_.Enqueue(std::move(request));
  }
  schedule_needed_ = true;
}

// --- The queue's clients: release, priority, goodput ------------------------

absl::StatusOr<v1::JobStatus> JobManager::Release(const std::string& job_id) {
  absl::StatusOr<v1::JobStatus> result = absl::UnavailableError("the coordinator is stopping");
  RunOnLoop([&] { result = ReleaseJob(job_id); });
  return result;
}

absl::StatusOr<v1::JobStatus> JobManager::ReleaseJob(const std::string& job_id) {
  STAGEWISE_BUG(OnLoop());
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    // Ended (or unknown: NOT_FOUND): nothing to release.
    STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", v1::JobState_Name(rec.status.state()), ", not suspended"));
  }
  Job& job = it->second;
  if (!job.status.suspended()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::JobState_Name(job.status.state()),
                     " and not suspended (it was not submitted with --suspended, or it was "
                     "released already)"));
  }
  FlushProgress();
  job.status.set_suspended(false);
  job.status.set_reason("released: waiting for workers");
  // Durable before it is queued: a restart never suspends it again.
  if (absl::Status s = store_->UpdateStatus(job.status); !s.ok()) {
    job.status.set_suspended(true);
    job.status.set_reason(kSuspendedReason);
    return s;
  }
  UpdateProgress(job, "released from suspension (stagewise resume); queued", {});
  Requeue(job_id, /*recovering=*/false);
  return job.status;
}

absl::StatusOr<v1::JobStatus> JobManager::SetPriority(const std::string& job_id,
                                                      const std::string& priority) {
  absl::StatusOr<v1::JobStatus> result = absl::UnavailableError("the coordinator is stopping");
  RunOnLoop([&] { result = SetPriorityOnLoop(job_id, priority); });
  return result;
}

absl::StatusOr<v1::JobStatus> JobManager::SetPriorityOnLoop(const std::string& job_id,
                                                            const std::string& priority) {
  STAGEWISE_BUG(OnLoop());
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
    return absl::FailedPreconditionError(
        absl::StrCat("priority: job ", job_id, " is ", v1::JobState_Name(rec.status.state())));
  }
  absl::StatusOr<int> rank = sharing_.RankOf(priority);
  if (!rank.ok() || priority.empty()) {
    return absl::InvalidArgumentError(rank.ok() ? "priority: name a class"
                                                : std::string(rank.status().message()));
  }
  Job& job = it->second;
  STAGEWISE_RETURN_IF_ERROR(sharing_.CheckOpenTo(*rank, job.status.owner()));
  if (!job.run.workers.empty() ||
      (job.status.state() != v1::PENDING && job.status.state() != v1::RECOVERING)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "priority: job ", job_id, " is ", v1::JobState_Name(job.status.state()),
        "; the class of a placed job does not change under it (cancel it and submit it again "
        "with `priority: ",
        priority, "`)"));
  }
  const std::string before = job.status.priority();
  FlushProgress();
  job.status.set_priority(sharing_.NameOf(*rank));
  // Durable before it acts: a restart keeps the new class.
  if (absl::Status s = store_->UpdateStatus(job.status); !s.ok()) {
    job.status.set_priority(before);
    return s;
  }
  UpdateProgress(job, absl::StrCat("priority: class ", before, " -> ", job.status.priority()), {});
  scheduler_.SetRank(job_id, *rank);
  schedule_needed_ = true;
  return job.status;
}

absl::StatusOr<v1::Goodput> JobManager::Goodput(const std::string& job_id) {
  std::optional<v1::Goodput> live;
  if (!RunOnLoop([&] {
        const absl::Time now = absl::Now();
        TickGoodput();
        if (job_id.empty()) {
          std::vector<const LiveJob*> all;
          for (const auto& [id, job] : jobs_) all.push_back(&job);
          live = goodput_.Cluster(all, now);
        } else if (auto it = jobs_.find(job_id); it != jobs_.end()) {
          live = ToProto(goodput_.JobUse(it->second, now));
          live->set_job_id(job_id);
        }
      })) {
    return absl::UnavailableError("the coordinator is stopping");
  }
  if (live.has_value()) return *live;
  // An ended job: what its attempts added up to.
  STAGEWISE_ASSIGN_OR_RETURN(v1::JobStatus st, queries_.GetJob(job_id));
  v1::Goodput g = ToProto(ReadUse(st.summary()));
  g.set_job_id(job_id);
  return g;
}

}  // namespace stagewise::coordinator
