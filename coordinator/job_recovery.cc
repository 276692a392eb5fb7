#include "coordinator/job_recovery.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "coordinator/end_cause.h"
#include "coordinator/event_admission.h"
#include "services/checkpoint/checkpoint.h"
#include "services/common/log.h"

namespace stagewise::coordinator {

void JobRecovery::Recover(const std::string& job_id, const std::string& why, v1::EndCause cause) {
  LiveJob* found = host_->FindJob(job_id);
  if (found == nullptr) return;
  LiveJob& job = *found;
  const v1::JobState state = job.status.state();
  if (state == v1::PENDING || state == v1::RECOVERING) {
    // Not running (anymore): nothing to end. A lost worker names the cause
    // better than the broken streams its peers reported first.
    if (state == v1::RECOVERING && cause == v1::END_CAUSE_WORKER_LOST &&
        job.status.attempts_size() > 0) {
      v1::JobAttempt* a = job.status.mutable_attempts(job.status.attempts_size() - 1);
      a->set_end_reason(why);
      SetEndCause(a, cause);
      host_->UpdateProgress(job, why, {});
    }
    return;
  }
  STAGEWISE_LOG(WARNING) << "job " << job_id << " attempt " << job.attempt_number
                         << " ended: " << why;
  // End the attempt: its stages stop, its workers are free again.
  host_->StopStages(job_id, absl::StrCat("attempt ", job.attempt_number, " ended: ", why));
  job.attempt = Attempt{};  // the attempt ends: all of it at once
  job.attempt_ended = absl::Now();
  job.max_step = std::max(job.max_step, job.status.step());
  if (state == v1::PROFILING) {
    // Only the profile was lost: back to the queue as it was, to profile
    // again. (Otherwise the profiles stay: rebalancing re-plans on them.)
    job.profiles.clear();
    host_->Requeue(job_id, /*recovering=*/false);
    (void)host_->Transition(job_id, v1::PENDING, why);
    return;
  }
  if (job.status.attempts_size() > 0) {
    v1::JobAttempt* a = job.status.mutable_attempts(job.status.attempts_size() - 1);
    if (a->ended_unix_ms() == 0) a->set_ended_unix_ms(absl::ToUnixMillis(absl::Now()));
    a->set_end_reason(why);
    SetEndCause(a, cause);
  }
  metrics_->CountRestart(CauseLabel(cause));
  // Not every end is a restart of its own (EndCausePolicy.counted): not an
  // attempt that never ran because its checkpoint was corrupt (the fault
  // that led to it was counted already), nor one ended on purpose.
  int ended = 0;
  for (const v1::JobAttempt& a : job.status.attempts()) {
    ended += a.ended_unix_ms() > 0 && PolicyOf(CauseOf(a)).counted() ? 1 : 0;
  }
  if (ended > job.spec.recovery.max_restarts) {
    host_->UpdateProgress(job, "", {});  // the attempt's end is written with the end
    host_->EndJob(job_id, v1::FAILED,
                  absl::StrCat("gave up after ", ended, " attempt(s) (recovery.max_restarts: ",
                               job.spec.recovery.max_restarts, "); the last one ended: ", why));
    return;
  }
  job.attempt_number++;
  job.status.set_attempt(job.attempt_number);
  host_->UpdateProgress(job, "", {});  // the new attempt number is written with the transition
  if (!host_->Transition(job_id, v1::RECOVERING, why).ok()) return;
  if (LiveJob* recovering = host_->FindJob(job_id)) QueueRecovery(job_id, *recovering, why);
}

bool JobRecovery::QueueRecovery(const std::string& job_id, LiveJob& job, const std::string& why) {
  // What a planned stop handed over (a new cut, more stages): this attempt's.
  const Handover next = std::move(job.next);
  job.next = Handover{};
  job.resume.reset();
  // All the stages again first (recovery.min_stages), unless the stop said
  // that fewer will do.
  job.fewer_stages = next.fewer_stages;
  if (!job.spec.checkpoint.dir.empty()) {
    std::vector<std::string> skipped;
    std::vector<checkpoint::Committed> committed =
        checkpoint::ListCommitted(job.spec.checkpoint.dir, job_id, false, &skipped);
    for (const std::string& line : skipped) {
      STAGEWISE_LOG(WARNING) << "job " << job_id << ": skipping checkpoint " << line;
    }
    for (checkpoint::Committed& c : committed) {
      // recovery.min_stages: any cut will do (the attempt reshards it).
      if (c.manifest.shards_size() != static_cast<int>(job.cut.ranges.size()) && !job.needs_plan &&
          job.spec.recovery.min_stages == 0) {
        STAGEWISE_LOG(WARNING) << "job " << job_id << ": skipping checkpoint " << c.dir << ": "
                               << c.manifest.shards_size() << " shards for "
                               << job.cut.ranges.size() << " stages";
        continue;
      }
      job.resume = std::move(c);
      break;
    }
  }
  if (job.resume) {
    // The stages must be cut as in the checkpoint (a planned partition, too).
    job.cut.ranges.clear();
    job.cut.modes.clear();
    bool any_modes = false;
    for (const v1::CheckpointShard& shard : job.resume->manifest.shards()) {
      job.cut.ranges.emplace_back(shard.block_begin(), shard.block_end());
      std::vector<BlockMode>& modes = job.cut.modes.emplace_back();
      // ReadManifest checked every shard's modes.
      modes = checkpoint::ShardModes(shard).value_or(std::vector<BlockMode>{});
      any_modes = any_modes || !modes.empty();
    }
    if (!any_modes) job.cut.modes.clear();
    job.status.set_num_stages(NumStages(job));
    job.planned = true;
    if (next.recut) {
      // Rebalancing: the new plan's cut, the checkpoint resharded onto it.
      job.cut = next.recut->cut;
      for (const auto& [key, value] : next.recut->summary) {
        (*job.status.mutable_summary())[key] = value;
      }
      job.status.set_num_stages(NumStages(job));
    }
    const int grow_to = next.grow_to;
    if (grow_to > NumStages(job)) {
      // recovery.min_stages: back to more stages, the checkpoint resharded.
      if (absl::StatusOr<std::string> cut = CutStages(job, grow_to); cut.ok()) {
        host_->UpdateProgress(job, absl::StrCat("growing to ", grow_to, " stages, blocks ", *cut),
                              {});
      } else {
        STAGEWISE_LOG(ERROR) << "job " << job_id << ": cannot grow: " << cut.status();
      }
    }
    host_->UpdateProgress(
        job,
        absl::StrCat("attempt ", job.attempt_number, " will resume from the checkpoint at step ",
                     job.resume->manifest.step(), " (", job.resume->dir, ")"),
        {});
  } else if (!job.spec.recovery.from_scratch) {
    host_->EndJob(
        job_id, v1::FAILED,
        absl::StrCat("no committed checkpoint to resume from and recovery.from_scratch is "
                     "false; the last attempt ended: ",
                     why));
    return false;
  } else {
    host_->UpdateProgress(job,
                          absl::StrCat("attempt ", job.attempt_number,
                                       " will start from step 0 (no committed checkpoint)"),
                          {});
  }
  job.recovery_deadline = next.wait_unbounded
                              ? absl::InfiniteFuture()
                              : absl::Now() + absl::Seconds(job.spec.recovery.wait_seconds);
  host_->Requeue(job_id, /*recovering=*/true);
  return true;
}

void JobRecovery::NoteLostWorker(const std::string& worker_id, const std::string& why) {
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (const std::string& id : host_->LiveJobIds()) {
    LiveJob& job = *host_->FindJob(id);
    // The newest ended attempt, if it ran on this worker and ended just now
    // for another cause.
    for (int i = job.status.attempts_size() - 1; i >= 0; --i) {
      v1::JobAttempt* a = job.status.mutable_attempts(i);
      if (a->ended_unix_ms() == 0) continue;
      const bool ran_there =
          std::find(a->workers().begin(), a->workers().end(), worker_id) != a->workers().end();
      const v1::EndCause cause = CauseOf(*a);
      if (ran_there && cause != v1::END_CAUSE_WORKER_LOST && !PolicyOf(cause).planned() &&
          now_ms - a->ended_unix_ms() <= absl::ToInt64Milliseconds(kLossWindow)) {
        STAGEWISE_LOG(INFO) << "job " << id << " attempt " << a->attempt() << " ended on: " << why;
        a->set_end_reason(absl::StrCat(why, " (first reported: ", a->end_reason(), ")"));
        SetEndCause(a, v1::END_CAUSE_WORKER_LOST);
        host_->UpdateProgress(job, why, {});
      }
      break;
    }
  }
}

void JobRecovery::CheckDeadlines(absl::Time now) {
  std::vector<std::string> stalled;
  for (const std::string& id : host_->LiveJobIds()) {
    const LiveJob& job = *host_->FindJob(id);
    if (now >= StallDeadline(job)) stalled.push_back(id);
  }
  for (const std::string& id : stalled) {
    LiveJob* found = host_->FindJob(id);
    if (found == nullptr) continue;
    const absl::Duration limit = StallLimit(*found);
    Recover(id,
            absl::StrCat("stalled: no progress past step ", found->attempt.progressed_step, " for ",
                         absl::FormatDuration(
                             absl::Trunc(now - found->attempt.progressed, absl::Seconds(1))),
                         " (limit ", absl::FormatDuration(limit),
                         found->spec.recovery.stall_seconds > 0 ? ", recovery.stall_seconds"
                                                                : ", 20x the median step time",
                         "); a stage stopped sending"),
            v1::END_CAUSE_STALLED);
  }
  std::vector<std::pair<std::string, bool>> due;  // (job, recovering)
  for (const std::string& id : host_->LiveJobIds()) {
    const LiveJob& job = *host_->FindJob(id);
    if (job.status.state() == v1::RECOVERING && now >= job.recovery_deadline) {
      due.emplace_back(id, true);
    } else if (job.status.state() == v1::CONFIGURING && now >= job.attempt.configure_deadline) {
      due.emplace_back(id, false);
    }
  }
  for (const auto& [id, recovering] : due) {
    LiveJob* found = host_->FindJob(id);
    if (found == nullptr) continue;
    LiveJob& job = *found;
    if (recovering && !job.fewer_stages && NumStages(job) > job.spec.recovery.min_stages &&
        job.spec.recovery.min_stages > 0) {
      // recovery.min_stages: from now on fewer stages will do.
      job.fewer_stages = true;
      job.recovery_deadline = now + absl::Seconds(job.spec.recovery.wait_seconds);
      host_->UpdateProgress(
          job,
          absl::StrCat("no ", NumStages(job), " idle workers within recovery.wait_seconds (",
                       job.spec.recovery.wait_seconds, " s): the job resumes on as few as ",
                       job.spec.recovery.min_stages, " stages (recovery.min_stages)"),
          {});
      host_->Requeue(id, /*recovering=*/true);
      continue;
    }
    if (recovering) {
      const std::string last =
          job.status.attempts_size() > 0
              ? job.status.attempts(job.status.attempts_size() - 1).end_reason()
              : job.status.reason();
      host_->EndJob(
          id, v1::FAILED,
          absl::StrCat(
              "no ", NumWorkerStages(job) * SpecReplicas(job),
              ElasticReplicaCounts(job).empty()
                  ? ""
                  : absl::StrCat(" (recovery.elastic: ", NumWorkerStages(job), ")"),
              job.fewer_stages
                  ? absl::StrCat(" (recovery.min_stages: ", job.spec.recovery.min_stages, ")")
                  : "",
              " idle workers within recovery.wait_seconds (", job.spec.recovery.wait_seconds,
              " s) after attempt ", job.attempt_number - 1, " ended: ", last));
    } else {
      std::vector<std::string> silent;
      for (const auto& [command, worker] : job.attempt.pending_acks) silent.push_back(worker);
      Recover(id,
              absl::StrCat("the stages did not acknowledge their assignment within ",
                           absl::FormatDuration(configure_timeout_), " (no answer from ",
                           absl::StrJoin(silent, ", "), ")"),
              v1::END_CAUSE_CONFIGURE_TIMEOUT);
    }
  }
}

void JobRecovery::OnStageError(const std::string& job_id, LiveJob& job, int stage,
                               const v1::StageError& e) {
  const auto code = static_cast<absl::StatusCode>(e.code());
  if (code == absl::StatusCode::kDataLoss && job.resume && job.status.state() == v1::CONFIGURING) {
    // The shard it was told to load is damaged: never offer that checkpoint
    // again; the next attempt takes an older one.
    const std::string dir = job.resume->dir;
    if (absl::Status s = checkpoint::MarkCorrupt(dir, e.message()); !s.ok()) {
      STAGEWISE_LOG(ERROR) << "job " << job_id << ": " << s;
    }
    Recover(job_id,
            absl::StrCat("checkpoint ", dir, " is corrupt (skipped from now on): ", e.message()),
            v1::END_CAUSE_CORRUPT_CHECKPOINT);
    return;
  }
  if (stage >= 0 && IsRetryable(e)) {
    const int ended = job.attempt_number;
    Recover(job_id, e.message(), v1::END_CAUSE_STAGE_ERROR);
    // This error ended the attempt (not one that had ended already).
    if (e.neighbour_stream() && job.attempt_number == ended + 1 && job.status.attempts_size() > 0) {
      v1::JobAttempt* a = job.status.mutable_attempts(job.status.attempts_size() - 1);
      if (a->attempt() == ended) a->set_end_reason_secondary(true);
    }
    return;
  }
  host_->EndJob(job_id, v1::FAILED, e.message());
}

void JobRecovery::NoteLateError(LiveJob& job, int attempt, const v1::StageError& e) {
  if (e.neighbour_stream()) return;
  for (int i = job.status.attempts_size() - 1; i >= 0; --i) {
    v1::JobAttempt* a = job.status.mutable_attempts(i);
    if (a->attempt() != attempt) continue;
    if (!a->end_reason_secondary() || a->ended_unix_ms() == 0) return;
    STAGEWISE_LOG(INFO) << "job " << job.status.job_id() << " attempt " << attempt
                        << " ended on: " << e.message();
    a->set_end_reason(absl::StrCat(e.message(), " (first reported: ", a->end_reason(), ")"));
    a->set_end_reason_secondary(false);
    host_->UpdateProgress(job, e.message(), {});
    return;
  }
}

void JobRecovery::BeginAttempt(LiveJob& job, std::vector<v1::Command>* commands) {
  // A new attempt: its record, and where it starts.
  v1::JobAttempt* a = job.status.add_attempts();
  a->set_attempt(job.attempt_number);
  a->set_started_unix_ms(absl::ToUnixMillis(absl::Now()));
  for (const std::string& w : job.attempt.workers) a->add_workers(w);
  if (job.resume) {
    const v1::CheckpointManifest& m = job.resume->manifest;
    a->set_from_step(m.step());
    a->set_reached_step(m.step());
    const int64_t redone = std::max<int64_t>(0, job.max_step - m.step());
    job.status.set_steps_redone(job.status.steps_redone() + redone);
    metrics_->AddStepsRedone(redone);
    job.status.set_step(m.step());
    job.status.set_phase(m.phase());
    const std::vector<PhaseSpec> phases = Phases(job.spec);
    if (m.phase() >= 0 && m.phase() < static_cast<int>(phases.size())) {
      job.status.set_phase_name(phases[m.phase()].name);
      job.status.set_algorithm(phases[m.phase()].algorithm.name());
    }
    for (size_t slot = 0; slot < commands->size(); ++slot) {
      *(*commands)[slot].mutable_configure()->mutable_resume() =
          ResumeFor(job, *job.resume, static_cast<int>(slot));
    }
  } else if (job.attempt_number > 0) {
    job.status.set_steps_redone(job.status.steps_redone() + job.max_step);
    metrics_->AddStepsRedone(job.max_step);
    job.status.set_step(0);
    job.status.set_phase(0);
  }
}

}  // namespace stagewise::coordinator
