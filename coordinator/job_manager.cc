#include "coordinator/job_manager.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "coordinator/event_admission.h"
#include "services/common/log.h"
#include "services/common/status_macros.h"
#include "services/common/utf8.h"

namespace stagewise::coordinator {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

v1::Command StartCommand(const std::string& job_id, int phase, int64_t from_step = 0) {
  v1::Command start;
  start.mutable_start()->set_job_id(job_id);
  start.mutable_start()->set_phase(phase);
  start.mutable_start()->set_from_step(from_step);
  return start;
}

v1::Command StopCommand(const std::string& job_id, const std::string& reason) {
  v1::Command stop;
  stop.mutable_stop()->set_job_id(job_id);
  stop.mutable_stop()->set_reason(reason);
  return stop;
}

}  // namespace

JobManager::JobManager(JobStore* store, metrics::CoordinatorMetrics* metrics,
                       JobManagerOptions options)
    : store_(store), metrics_(metrics), options_(options) {
  if (options_.sharing.has_value()) {
    usage_.set_half_life(absl::Seconds(sharing_.half_life_seconds));
    scheduler_.SetSharing(&sharing_, &usage_);
    preemptor_.set_config(&sharing_);
  }
}

JobManager::~JobManager() { Stop(); }

// --- Start, Stop and the loop ---------------------------------------------

absl::Status JobManager::Start() {
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<JobRecord> unfinished, store_->UnfinishedJobs());
  // No loop yet: this thread owns the loop's state until the loop starts.
  loop_.BindCaller();
  for (const JobRecord& rec : unfinished) Resume(rec);
  RefreshGauges();
  return loop_.Start();
}

void JobManager::Resume(const JobRecord& rec) {
  STAGEWISE_BUG(OnLoop());
  const std::string& id = rec.status.job_id();
  absl::StatusOr<Job> restored = RestoreLiveJob(rec);
  if (!restored.ok()) {
    (void)Transition(id, v1::FAILED, std::string(restored.status().message()));
    return;
  }
  const v1::JobState state = rec.status.state();
  // Its class under this coordinator's config (the default one for a class
  // no longer listed).
  restored->status.set_priority(sharing_.NameOf(RankOfJob(sharing_, *restored)));
  jobs_.emplace(id, *std::move(restored));
  if (state == v1::PENDING || state == v1::PROFILING) {
    // Not placed yet (or only profiling): queue it again as it was.
    if (state == v1::PROFILING) {
      if (!Transition(id, v1::PENDING, "the coordinator restarted while the job was PROFILING")
               .ok()) {
        jobs_.erase(id);
        return;
      }
    } else {
      view_.Publish(rec.status, "");
    }
    Requeue(id, /*recovering=*/false);
    return;
  }
  // It was placed: its stages stopped when they lost this coordinator.
  // Resume it from its newest committed checkpoint.
  const std::string why =
      absl::StrCat("the coordinator restarted while the job was ", v1::JobState_Name(state));
  if (state == v1::RECOVERING) {
    recovery_.QueueRecovery(id, jobs_.at(id), why);
  } else {
    recovery_.Recover(id, why, v1::END_CAUSE_COORDINATOR_RESTART);
  }
}

void JobManager::Stop() { loop_.Stop(); }

TaskLoop::Hooks JobManager::LoopHooks() {
  TaskLoop::Hooks hooks;
  hooks.next_deadline = [this] { return NextDeadline(); };
  hooks.after_task = [this] {
    placer_.PassIfNeeded();
    TickGoodput();
    if (absl::Now() >= flush_due_) FlushProgress();
  };
  hooks.housekeeping = [this] {
    Housekeeping(absl::Now());
    placer_.PassIfNeeded();
  };
  hooks.end_of_batch = [this](bool idle) {
    if (idle) FlushProgress();  // the queue ran dry: write the batch now
    RefreshGauges();
  };
  hooks.on_stop = [this] { FlushProgress(); };
  return hooks;
}

absl::Time JobManager::NextDeadline() const {
  absl::Time deadline = absl::Now() + options_.housekeeping;
  // Expire() needs strictly more than the timeout of silence.
  deadline =
      std::min(deadline, registry_.NextExpiry(options_.heartbeat_timeout) + absl::Milliseconds(1));
  deadline = std::min(deadline, flush_due_);
  if (!metrics_expiry_.empty()) deadline = std::min(deadline, metrics_expiry_.front().first);
  for (const auto& [id, job] : jobs_) {
    deadline = std::min(
        {deadline, job.recovery_deadline, job.attempt.configure_deadline, StallDeadline(job)});
  }
  // A settling recovery becomes placeable (Housekeeping schedules then).
  return std::min(deadline, scheduler_.NextDue());
}

void JobManager::Housekeeping(absl::Time now) {
  for (const WorkerRegistry::Removed& lost : registry_.Expire(now, options_.heartbeat_timeout)) {
    OnWorkerLost(
        lost, absl::StrCat("no heartbeat for ", absl::FormatDuration(options_.heartbeat_timeout)));
  }
  recovery_.CheckDeadlines(now);
  planned_.CheckDeadlines(now);
  if (now >= scheduler_.NextDue()) placer_.MarkNeeded();  // a settle window passed
  // Priority classes: a job that waits may find a victim that was not one at
  // the last pass (it has started running since, or a stop timed out).
  if (!sharing_.classes.empty() && scheduler_.size() > 0 && now >= next_sharing_pass_) {
    placer_.MarkNeeded();
    next_sharing_pass_ = now + absl::Seconds(1);
  }
  if (scheduler_.size() == 0) placer_.MaybeGrow();
  if (now >= flush_due_) FlushProgress();
  while (!metrics_expiry_.empty() && metrics_expiry_.front().first <= now) {
    metrics_->RemoveJob(metrics_expiry_.front().second);
    metrics_expiry_.pop_front();
  }
}

// --- Clients ----------------------------------------------------------------

absl::StatusOr<std::string> JobManager::Submit(const std::string& yaml, const std::string& owner,
                                               bool suspended) {
  // The view holds every live job: count the owner's.
  if (const int live = view_.CountOwnedBy(owner); live >= options_.max_live_jobs_per_owner) {
    metrics_->CountRefused("too_many_jobs");
    return absl::ResourceExhaustedError(
        absl::StrCat("'", owner.empty() ? "anonymous" : owner, "' has ", live,
                     " jobs that have not ended; at most ", options_.max_live_jobs_per_owner,
                     " (wait for some, or cancel)"));
  }
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(yaml);
  if (!parsed.ok()) {
    metrics_->CountRefused("bad_spec");
    return parsed.status();
  }
  STAGEWISE_ASSIGN_OR_RETURN(Submission submission,
                             PrepareSubmission(*std::move(parsed), options_.checkpoint_roots));
  if (absl::Status s = CheckJobAgainst(sharing_, submission.spec, owner); !s.ok()) {
    metrics_->CountRefused("bad_spec");
    return s;
  }
  if (!loop_.accepting()) {
    return absl::UnavailableError("the coordinator is not running (starting or shutting down)");
  }
  JobRecord record;
  record.spec_yaml = yaml;
  record.status = InitialStatus(submission, owner);
  v1::JobStatus& st = record.status;
  st.set_priority(sharing_.NameOf(sharing_.RankOf(submission.spec.priority).value_or(0)));
  st.set_job_id(store_->NewJobId());
  if (suspended) {
    st.set_suspended(true);
    st.set_reason(kSuspendedReason);
  }
  // The one durable write of a submission, on the caller's thread, no lock held.
  STAGEWISE_RETURN_IF_ERROR(store_->CreateJob(record));
  view_.Publish(st, "");  // visible to GetJob / WatchJob before the id is returned
  Job job = MakeLiveJob(st, submission, yaml);
  if (!loop_.Post([this, job = std::move(job)]() mutable { Admit(std::move(job)); })) {
    // Stopping: the job stays PENDING in the store; the next Start queues it.
    STAGEWISE_LOG(WARNING) << "job " << st.job_id() << " submitted while stopping; kept PENDING";
  }
  return st.job_id();
}

void JobManager::Admit(Job job) {
  STAGEWISE_BUG(OnLoop());
  const std::string id = job.status.job_id();
  metrics_->CountTransition("PENDING");
  jobs_.emplace(id, std::move(job));
  Requeue(id, /*recovering=*/false);
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& job_id,
                                                 const std::string& reason) {
  // Stored with the job and sent in every listing: bounded.
  if (reason.size() > kMaxCancelReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason: at most ", kMaxCancelReasonBytes, " bytes, got ", reason.size()));
  }
  // Kept and sent as a proto string: valid UTF-8 whatever an embedder passes.
  const std::string why = reason.empty() ? "cancelled by the user" : ToValidUtf8(reason);
  absl::StatusOr<v1::JobStatus> result = absl::UnavailableError("the coordinator is stopping");
  loop_.RunOnLoop([&] { result = CancelJob(job_id, why); });
  return result;
}

absl::StatusOr<v1::JobStatus> JobManager::CancelJob(const std::string& job_id,
                                                    const std::string& reason) {
  STAGEWISE_BUG(OnLoop());
  if (jobs_.count(job_id)) EndJob(job_id, v1::CANCELLED, reason);
  // Finished (or unknown: NOT_FOUND) jobs answer with their stored status.
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  return rec.status;
}

std::vector<v1::WorkerInfo> JobManager::ListWorkers() const { return registry_.List(); }

// --- Workers (gRPC threads) ------------------------------------------------

absl::StatusOr<v1::JobStatus> JobManager::OnLiveJob(
    const std::string& job_id, const std::string& prefix, const std::string& suffix,
    const std::function<absl::StatusOr<v1::JobStatus>(LiveJob&)>& act) {
  absl::StatusOr<v1::JobStatus> result = absl::UnavailableError("the coordinator is stopping");
  loop_.RunOnLoop([&] {
    if (LiveJob* job = FindJob(job_id)) {
      result = act(*job);
      return;
    }
    // Ended (or unknown: NOT_FOUND).
    absl::StatusOr<JobRecord> rec = store_->GetJob(job_id);
    if (!rec.ok()) {
      result = rec.status();
      return;
    }
    result = absl::FailedPreconditionError(absl::StrCat(
        prefix, "job ", job_id, " is ", v1::JobState_Name(rec->status.state()), suffix));
  });
  return result;
}

absl::StatusOr<v1::JobStatus> JobManager::Release(const std::string& job_id) {
  return OnLiveJob(
      job_id, "", ", not suspended",
      [&](LiveJob& job) -> absl::StatusOr<v1::JobStatus> { return placer_.Release(job_id, job); });
}

absl::StatusOr<v1::JobStatus> JobManager::SetPriority(const std::string& job_id,
                                                      const std::string& priority) {
  return OnLiveJob(job_id, "priority: ", "", [&](LiveJob& job) -> absl::StatusOr<v1::JobStatus> {
    return placer_.SetPriority(job_id, job, priority);
  });
}

absl::StatusOr<v1::Goodput> JobManager::Goodput(const std::string& job_id) {
  std::optional<v1::Goodput> live;
  if (!loop_.RunOnLoop([&] {
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

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::Register(
    const v1::WorkerInfo& info, const WorkerRegistry::Caller& caller) {
  std::optional<WorkerRegistry::Removed> replaced;
  v1::RegisterWorkerResponse resp;
  auto id = registry_.Register(info, caller, absl::Now(), &replaced, resp.mutable_session());
  if (!id.ok()) {
    metrics_->CountRefused(absl::IsAlreadyExists(id.status()) ? "worker_id_taken"
                                                              : "bad_registration");
    return id.status();
  }
  if (replaced.has_value()) {
    loop_.Post(
        [this, lost = *replaced] { OnWorkerLost(lost, "it registered again (restarted?)"); });
  }
  resp.set_worker_id(*id);
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return resp;
}

absl::Status JobManager::Connect(const std::string& worker_id, const std::string& session,
                                 CommandSink* sink, const WorkerRegistry::Caller& caller) {
  if (absl::Status s = registry_.Connect(worker_id, session, caller, sink, absl::Now()); !s.ok()) {
    metrics_->CountRefused("bad_session");
    return s;
  }
  loop_.Post([this] { placer_.MarkNeeded(); });
  return absl::OkStatus();
}

void JobManager::Disconnect(const std::string& worker_id, CommandSink* sink,
                            const absl::Status& why) {
  std::optional<WorkerRegistry::Removed> removed = registry_.Disconnect(worker_id, sink);
  if (!removed.has_value()) return;
  loop_.Post([this, lost = *removed, why = std::string(why.message())] {
    OnWorkerLost(lost, absl::StrCat("its control stream closed (", why, ")"));
  });
}

void JobManager::OnEvent(const v1::WorkerEvent& event) {
  if (event.has_error() && !IsValidUtf8(event.error().message())) {
    // gRPC only delivers UTF-8; an embedder may not. Reasons are proto strings.
    v1::WorkerEvent clean = event;
    clean.mutable_error()->set_message(ToValidUtf8(event.error().message()));
    OnEvent(clean);
    return;
  }
  if (!registry_.Touch(event.worker_id(), absl::Now())) return;
  // A heartbeat (or an empty event): Touch was all of it.
  if (event.has_heartbeat() || event.event_case() == v1::WorkerEvent::EVENT_NOT_SET) return;
  loop_.Post([this, event] { HandleEvent(event); });
}

// --- Loop thread: events ----------------------------------------------------

void JobManager::HandleEvent(const v1::WorkerEvent& event) {
  STAGEWISE_BUG(OnLoop());
  if (event.has_preempting()) return OnPreempting(event.worker_id(), event.preempting());
  const Admission admission = AdmitEvent(event, FindJob(event.job_id()));
  switch (admission.verdict) {
    case Admission::Verdict::kTake:
      break;
    case Admission::Verdict::kRefuse:
      metrics_->CountRefused(admission.label);
      // Bounded logging: a misbehaving peer must not flood the log.
      if (!admission.quiet() && (++refused_events_ <= 20 || refused_events_ % 1000 == 0)) {
        STAGEWISE_LOG(WARNING) << "ignoring an event (case " << event.event_case()
                               << ") from worker " << event.worker_id() << ": " << admission.why
                               << " (" << refused_events_ << " ignored so far)";
      }
      return;
    case Admission::Verdict::kDropStale:
      if (event.has_error()) {
        if (LiveJob* job = FindJob(event.job_id())) {
          recovery_.NoteLateError(*job, event.attempt(), event.error());
        }
      }
      return;
    case Admission::Verdict::kFailJob:
      EndJob(event.job_id(), v1::FAILED, admission.why);
      return;
  }
  const std::string& job_id = event.job_id();
  // Replicas of a stage train in lockstep: replica 0 speaks for the job's
  // progress, checkpoints (one shard per stage), timeline and summary; every
  // replica's result and phase end count (docs/replicas.md).
  const bool first_replica = event.replica() == 0;
  switch (event.event_case()) {
    case v1::WorkerEvent::kCheckpointSaved:
      if (!first_replica) return;
      jobs_.at(job_id).attempt.use.CheckpointWrite(event.checkpoint_saved().step(), event.stage(),
                                                   event.checkpoint_saved().seconds());
      committer_.OnShardSaved(job_id, jobs_.at(job_id), event.stage(), event.checkpoint_saved());
      return planned_.OnCommitted(job_id, jobs_.at(job_id));
    case v1::WorkerEvent::kReplayDone:
      return replacer_.OnReplayDone(jobs_.at(job_id), event.stage(), event.replay_done());
    case v1::WorkerEvent::kCheckpointPlanned:
      if (!first_replica || event.stage() != 0) return;
      return planned_.OnPlanned(jobs_.at(job_id), event.checkpoint_planned().step());
    case v1::WorkerEvent::kTrace:
      if (!first_replica) return;
      return OnTrace(event);
    case v1::WorkerEvent::kAck:
      return OnAck(event.ack(), event.worker_id());
    case v1::WorkerEvent::kMetrics:
      if (!first_replica) {
        return ApplyReplicaMetrics(jobs_.at(job_id), event.stage(), event.replica(),
                                   event.metrics(), absl::Now());
      }
      return OnMetrics(job_id, event.stage(), WithoutNonFinite(event.metrics()));
    case v1::WorkerEvent::kResult:
      return OnResult(job_id, event.stage(), event.replica(), WithoutNonFinite(event.result()));
    case v1::WorkerEvent::kPhaseDone:
      return OnPhaseDone(job_id, SlotOf(jobs_.at(job_id), event.stage(), event.replica()),
                         event.phase_done());
    case v1::WorkerEvent::kProfile:
      return placer_.OnProfile(job_id, event.profile(), event.worker_id());
    case v1::WorkerEvent::kError:
      return recovery_.OnStageError(job_id, jobs_.at(job_id), event.stage(), event.error());
    default:
      return;
  }
}

void JobManager::OnAck(const v1::Ack& ack, const std::string& sender) {
  STAGEWISE_BUG(OnLoop());
  if (replacer_.OnAck(ack.command_id(), sender)) return;
  for (auto& [id, job] : jobs_) {
    auto pending = job.attempt.pending_acks.find(ack.command_id());
    if (pending == job.attempt.pending_acks.end()) continue;
    if (pending->second != sender) return;  // not the worker the command went to
    job.attempt.pending_acks.erase(pending);
    if (!job.attempt.pending_acks.empty() || job.status.state() != v1::CONFIGURING) return;
    const std::string job_id = id;  // `id` dies if the transition ends the job
    if (!Transition(job_id, v1::RUNNING, "").ok()) return;
    Job& running = jobs_.at(job_id);
    running.attempt.started = absl::Now();
    goodput_.Running(running, running.attempt.started);
    running.attempt.progressed = running.attempt.started;
    running.attempt.progressed_step = running.resume ? running.resume->manifest.step() : 0;
    running.attempt.evaluated_step = -1;
    running.attempt.configure_deadline = absl::InfiniteFuture();
    const int phase = running.resume ? running.resume->manifest.phase() : 0;
    const int64_t from = running.resume ? running.resume->manifest.step() : 0;
    if (running.attempt_ended != absl::InfinitePast()) {
      metrics_->ObserveRecovery(
          absl::ToDoubleSeconds(running.attempt.started - running.attempt_ended));
      running.attempt_ended = absl::InfinitePast();
    }
    for (const std::string& worker : DistinctWorkers(running)) {
      Send(worker, StartCommand(job_id, phase, from));  // starts every stage it holds
    }
    return;
  }
}

void JobManager::OnTrace(const v1::WorkerEvent& event) {
  STAGEWISE_BUG(OnLoop());
  // The stored chunk names its stage and attempt (the envelope's).
  v1::TraceChunk chunk = event.trace();
  chunk.set_job_id(event.job_id());
  chunk.set_stage(event.stage());
  chunk.set_attempt(event.attempt());
  absl::StatusOr<int64_t> stored = store_->TraceSpans(chunk.job_id());
  if (!stored.ok()) {
    STAGEWISE_LOG(WARNING) << "job " << chunk.job_id() << ": trace not stored: " << stored.status();
    return;
  }
  v1::TraceChunk kept = chunk;
  const int64_t room = std::max<int64_t>(0, kMaxTraceSpans - *stored);
  if (kept.spans_size() > room) {
    kept.set_refused(kept.spans_size() - room);
    kept.mutable_spans()->DeleteSubrange(static_cast<int>(room),
                                         static_cast<int>(kept.spans_size() - room));
  }
  if (absl::Status s = store_->AppendTrace(chunk.job_id(), kept); !s.ok()) {
    STAGEWISE_LOG(WARNING) << "job " << chunk.job_id() << ": trace not stored: " << s;
  }
}

void JobManager::OnMetrics(const std::string& job_id, int stage, const v1::MetricsReport& m) {
  STAGEWISE_BUG(OnLoop());
  Job& job = jobs_.at(job_id);
  if (const auto it = m.values().find("compute_seconds"); it != m.values().end()) {
    rebalancer_.OnComputeTime(job_id, job, stage, m.step(), it->second, absl::Now());
    job.attempt.use.Compute(stage, it->second);
  }
  std::vector<MetricPoint> points = ApplyMetrics(job, stage, m, absl::Now());
  replacer_.OnProgress(job);
  if (points.empty()) return;
  const v1::JobStatus& st = job.status;
  for (const MetricPoint& p : points) {
    if (p.name == "train_loss") {
      metrics_->SetJobProgress(job_id, p.step, st.train_loss(), st.samples_per_second());
    } else if (p.name == "eval_accuracy") {
      metrics_->SetJobEval(job_id, st.eval_loss(), st.eval_accuracy());
    }
    if (st.tokens_per_sample() > 0 && (p.name == "train_loss" || p.name == "eval_accuracy")) {
      metrics_->SetJobText(job_id, st.samples_per_second() * st.tokens_per_sample(),
                           p.name == "eval_accuracy" ? st.eval_loss() / std::log(2.0) : -1);
    }
  }
  UpdateProgress(job, "", std::move(points));
}

void JobManager::OnResult(const std::string& job_id, int stage, int replica,
                          const v1::StageResult& result) {
  STAGEWISE_BUG(OnLoop());
  Job& job = jobs_.at(job_id);
  job.attempt.finished_stages.insert(SlotOf(job, stage, replica));
  if (replica == 0) UpdateProgress(job, "", ApplyResult(job, stage, result, absl::Now()));
  if (job.attempt.finished_stages.size() == job.attempt.workers.size()) {
    if (job.status.attempts_size() > 0) {
      v1::JobAttempt* a = job.status.mutable_attempts(job.status.attempts_size() - 1);
      a->set_ended_unix_ms(NowMs());
      a->set_reached_step(job.status.total_steps());
    }
    job.status.set_step(job.status.total_steps());
    EndJob(job_id, v1::SUCCEEDED, "");
  }
}

void JobManager::OnPhaseDone(const std::string& job_id, int slot, const v1::PhaseDone& d) {
  STAGEWISE_BUG(OnLoop());
  // Every stage (of every replica) finished phase p: record it and let them
  // all start p + 1.
  Job& job = jobs_.at(job_id);
  std::set<int>& done = job.attempt.phase_done[d.phase()];
  done.insert(slot);
  // Only the phase's end is progress for the stall watchdog: one stage's
  // PhaseDone moves nothing (AdmitEvent refuses repeats and other phases).
  if (done.size() < job.attempt.workers.size()) return;
  NoteProgress(job, -1, absl::Now());
  const std::vector<PhaseSpec> phases = Phases(job.spec);
  const int next = d.phase() + 1;
  if (next >= static_cast<int>(phases.size())) {
    EndJob(job_id, v1::FAILED,
           absl::StrCat("stages reported the end of phase ", d.phase(), " but the job has only ",
                        phases.size(), " phase(s)"));
    return;
  }
  job.status.set_phase(next);
  job.status.set_phase_name(phases[next].name);
  job.status.set_algorithm(phases[next].algorithm.name());
  UpdateProgress(job,
                 absl::StrCat("phase ", next + 1, "/", phases.size(), " (", phases[next].name, ", ",
                              phases[next].algorithm.name(), ") started"),
                 {});
  FlushProgress();  // the new phase is on disk before the stages start it
  for (const std::string& worker : DistinctWorkers(job)) Send(worker, StartCommand(job_id, next));
}

void JobManager::OnPreempting(const std::string& worker_id, const v1::Preempting& preempting) {
  STAGEWISE_BUG(OnLoop());
  const std::optional<std::string> job_id = registry_.MarkDraining(worker_id);
  if (!job_id.has_value()) return;
  STAGEWISE_LOG(WARNING) << "worker " << worker_id << " is being preempted (it leaves within "
                         << preempting.grace_seconds() << " s)";
  LiveJob* job = job_id->empty() ? nullptr : FindJob(*job_id);
  if (job == nullptr) return;
  const std::string reason = absl::StrCat("worker ", worker_id, " is being preempted");
  if (!planned_.Begin(*job_id, *job, reason, v1::END_CAUSE_PREEMPTED) &&
      !job->attempt.planned_stop) {
    // No checkpoint to take first (none kept, or not running yet): the
    // worker is as good as lost; stopping its stages now lets it go at once.
    recovery_.Recover(*job_id, absl::StrCat(reason, " (no checkpoint could be taken first)"),
                      v1::END_CAUSE_WORKER_LOST);
  }
}

void JobManager::OnWorkerLost(const WorkerRegistry::Removed& worker, const std::string& why) {
  STAGEWISE_LOG(WARNING) << "lost worker " << worker.worker_id << ": " << why;
  if (worker.job_id.empty()) {
    // Freed by an attempt that just ended (its peers' broken streams ended
    // it first): that attempt's cause is this loss.
    recovery_.NoteLostWorker(worker.worker_id,
                             absl::StrCat("lost worker ", worker.worker_id, ": ", why));
    return;
  }
  const std::string text =
      worker.stage >= 0
          ? absl::StrCat("lost worker ", worker.worker_id, " (stage ", worker.stage,
                         worker.replica >= 0 ? absl::StrCat(", replica ", worker.replica) : "",
                         "): ", why)
          : absl::StrCat("lost worker ", worker.worker_id, ": ", why);
  // recovery.replay: only its stage goes back, on an idle worker.
  if (LiveJob* job = FindJob(worker.job_id);
      job != nullptr && replacer_.TryReplace(worker.job_id, *job, worker.worker_id, text)) {
    return;
  }
  recovery_.Recover(worker.job_id, text, v1::END_CAUSE_WORKER_LOST);
}

// --- JobHost -------------------------------------------------------------

LiveJob* JobManager::FindJob(const std::string& job_id) {
  STAGEWISE_BUG(OnLoop());
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<std::string> JobManager::LiveJobIds() const {
  STAGEWISE_BUG(OnLoop());
  std::vector<std::string> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  return ids;
}

absl::Status JobManager::ChangeStatus(LiveJob& job,
                                      const std::function<void(v1::JobStatus&)>& change) {
  STAGEWISE_BUG(OnLoop());
  FlushProgress();  // what was pending is written as it was, before the change
  const v1::JobStatus before = job.status;
  change(job.status);
  if (absl::Status s = store_->UpdateStatus(job.status); !s.ok()) {
    job.status = before;
    return s;
  }
  return absl::OkStatus();
}

void JobManager::StopStages(const std::string& job_id, const std::string& reason) {
  STAGEWISE_BUG(OnLoop());
  usage_.Release(job_id, absl::Now());
  // The attempt ends (JobRecovery): the steps past its checkpoint are redone.
  if (LiveJob* job = FindJob(job_id)) goodput_.AttemptEnded(*job, absl::Now(), /*redo=*/true);
  for (const std::string& worker : registry_.Release(job_id)) {
    Send(worker, StopCommand(job_id, reason));
  }
}

absl::StatusOr<v1::JobStatus> JobManager::Transition(const std::string& job_id, v1::JobState to,
                                                     const std::string& reason) {
  STAGEWISE_BUG(OnLoop());
  FlushProgress();  // what happened before the transition is on disk before it
  absl::StatusOr<v1::JobStatus> st =
      store_->Transition(job_id, to, IsValidUtf8(reason) ? reason : ToValidUtf8(reason));
  if (!st.ok()) {
    STAGEWISE_LOG(ERROR) << "job " << job_id << ": " << st.status();
    return st.status();
  }
  if (auto it = jobs_.find(job_id); it != jobs_.end()) {
    // Keep our copy (the flush made it the store's, but a failed flush would not).
    v1::JobStatus& ours = it->second.status;
    ours.set_state(st->state());
    ours.set_reason(st->reason());
    ours.set_updated_unix_ms(st->updated_unix_ms());
    *st = ours;
  }
  metrics_->CountTransition(v1::JobState_Name(to));
  if (IsTerminal(to)) {
    if (options_.finished_job_metrics_ttl <= absl::ZeroDuration()) {
      metrics_->RemoveJob(job_id);
    } else {
      metrics_expiry_.emplace_back(absl::Now() + options_.finished_job_metrics_ttl, job_id);
    }
  }
  view_.Publish(*st, reason);
  return st;
}

// By value: callers pass strings owned by the job (its map key, its status),
// which the erase below destroys (found by the coordinator fuzz target).
absl::Status JobManager::CollectiveStore(const v1::CollectiveStoreRequest& request,
                                         const WorkerRegistry::Caller& caller,
                                         v1::CollectiveStoreResponse* response) {
  if (absl::Status s = registry_.CheckSession(request.worker_id(), request.session(), caller);
      !s.ok()) {
    return s;
  }
  absl::Status member = absl::UnavailableError("the coordinator is stopping");
  loop_.RunOnLoop([&] {
    auto it = jobs_.find(request.job_id());
    if (it == jobs_.end()) {
      member =
          absl::FailedPreconditionError(absl::StrCat("job ", request.job_id(), " is not running"));
    } else if (it->second.attempt_number != request.attempt()) {
      member = absl::FailedPreconditionError(absl::StrCat(
          "attempt ", request.attempt(), " of job ", request.job_id(), " is not the current one"));
    } else if (std::find(it->second.attempt.workers.begin(), it->second.attempt.workers.end(),
                         request.worker_id()) == it->second.attempt.workers.end()) {
      member = absl::PermissionDeniedError(
          absl::StrCat("worker ", request.worker_id(), " runs no stage of job ", request.job_id()));
    } else {
      member = absl::OkStatus();
    }
  });
  if (!member.ok()) return member;
  return collective_.Apply(request, response);
}

void JobManager::EndJob(std::string job_id, v1::JobState state, std::string reason) {
  STAGEWISE_BUG(OnLoop());
  if (!jobs_.count(job_id)) return;
  collective_.Drop(job_id);
  scheduler_.Remove(job_id);
  {
    Job& job = jobs_.at(job_id);
    job.status.set_queue_position(0);
    goodput_.AttemptEnded(job, absl::Now(), /*redo=*/false);
    goodput_.Dequeued(job, absl::Now());
    UpdateProgress(job, "", {});  // stored with the transition's flush
  }
  (void)Transition(job_id, state, reason);
  jobs_.erase(job_id);
  usage_.Release(job_id, absl::Now());
  for (const std::string& worker : registry_.Release(job_id)) {
    if (state != v1::SUCCEEDED) Send(worker, StopCommand(job_id, reason));
  }
  placer_.MarkNeeded();
}

void JobManager::UpdateProgress(Job& job, const std::string& message,
                                std::vector<MetricPoint> points) {
  STAGEWISE_BUG(OnLoop());
  job.status.set_updated_unix_ms(NowMs());
  dirty_.insert(job.status.job_id());
  for (MetricPoint& p : points) points_.emplace_back(job.status.job_id(), std::move(p));
  // A message is an event of the job's log (`stagewise events`), written with the progress.
  if (!message.empty()) {
    notes_.emplace_back(job.status.job_id(),
                        TransitionRecord{job.status.state(), job.status.state(), message,
                                         job.status.updated_unix_ms()});
  }
  if (flush_due_ == absl::InfiniteFuture()) {
    flush_due_ = absl::Now() + options_.progress_flush_interval;
  }
  view_.Publish(job.status, message);
}

void JobManager::FlushProgress() {
  flush_due_ = absl::InfiniteFuture();
  if (dirty_.empty() && points_.empty() && notes_.empty()) return;
  JobStore::ProgressBatch batch;
  for (const std::string& id : dirty_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end()) batch.statuses.push_back(it->second.status);
  }
  batch.points = std::move(points_);
  batch.notes = std::move(notes_);
  dirty_.clear();
  points_.clear();
  notes_.clear();
  if (absl::Status s = store_->WriteProgress(batch); !s.ok()) {
    STAGEWISE_LOG(ERROR) << "progress of " << batch.statuses.size() << " job(s), "
                         << batch.points.size() << " metric point(s), " << batch.notes.size()
                         << " note(s) not saved: " << s;
  }
}

void JobManager::Send(const std::string& worker_id, v1::Command command) {
  if (command.command_id() == 0) command.set_command_id(next_command_++);
  registry_.Send(worker_id, command);
}

void JobManager::TickGoodput() {
  goodput_.Tick(absl::Now(), registry_.GetCounts().registered, usage_.TotalHeld(),
                scheduler_.size() > 0);
}

void JobManager::RefreshGauges() {
  const WorkerRegistry::Counts workers = registry_.GetCounts();
  metrics_->SetWorkers(workers.idle, workers.busy);
  if (const absl::Time now = absl::Now(); now - goodput_published_ >= absl::Seconds(1)) {
    goodput_published_ = now;
    TickGoodput();
    std::vector<const LiveJob*> all;
    for (const auto& [id, job] : jobs_) all.push_back(&job);
    const v1::Goodput g = goodput_.Cluster(all, now);
    metrics_->SetGoodput(ByUse(g), g.goodput());
    absl::MutexLock lock(&goodput_mu_);
    published_goodput_ = g;
  }
  std::map<std::string, int64_t> counts = {{"PENDING", 0}, {"CONFIGURING", 0}, {"RUNNING", 0}};
  for (const auto& [id, job] : jobs_) counts[v1::JobState_Name(job.status.state())]++;
  for (const auto& [state, n] : counts) metrics_->SetJobsInState(state, n);
}

}  // namespace stagewise::coordinator
