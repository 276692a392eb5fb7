#include "coordinator/planned_stop.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/common/log.h"

namespace stagewise::coordinator {

bool PlannedStops::Begin(const std::string& job_id, LiveJob& job, const std::string& reason,
                         v1::EndCause cause, Handover handover, std::string for_job) {
  if (job.status.state() != v1::RUNNING || job.spec.checkpoint.dir.empty() ||
      job.attempt.planned_stop || job.attempt.workers.empty()) {
    return false;
  }
  job.attempt.planned_stop = Attempt::PlannedStop{
      reason, cause, std::move(handover), -1, absl::Now() + kTimeout, std::move(for_job)};
  v1::Command command;
  v1::CheckpointCommand* c = command.mutable_checkpoint_soon();
  c->set_job_id(job_id);
  c->set_attempt(job.attempt_number);
  c->set_reason(reason);
  host_->Send(job.attempt.workers.front(), std::move(command));  // slot 0: stage 0, replica 0
  host_->UpdateProgress(
      job, absl::StrCat(reason, ": checkpointing at the next step boundary, then resuming"), {});
  return true;
}

void PlannedStops::OnPlanned(LiveJob& job, int64_t step) {
  if (!job.attempt.planned_stop || job.attempt.planned_stop->step >= 0) return;
  job.attempt.planned_stop->step = step;
  host_->UpdateProgress(
      job, absl::StrCat(job.attempt.planned_stop->reason, ": the job checkpoints at step ", step),
      {});
}

void PlannedStops::OnCommitted(const std::string& job_id, LiveJob& job) {
  if (!job.attempt.planned_stop || job.attempt.planned_stop->step < 0 ||
      job.status.last_checkpoint_step() < job.attempt.planned_stop->step) {
    return;
  }
  const Attempt::PlannedStop stop = std::move(*job.attempt.planned_stop);
  job.attempt.planned_stop.reset();
  job.next = stop.handover;
  // The steps the job reached past the checkpoint are redone: its cost.
  const int64_t past = std::max<int64_t>(0, job.status.step() - job.status.last_checkpoint_step());
  const std::string id = job_id;  // Recover may end the job (and its strings)
  recovery_->Recover(
      id,
      absl::StrCat(stop.reason, " (checkpoint at step ", job.status.last_checkpoint_step(),
                   " committed; ", past, past == 1 ? " step" : " steps", " past it to redo)"),
      stop.cause);
  LiveJob* after = host_->FindJob(id);
  if (after == nullptr || stop.for_job.empty() || after->status.attempts_size() == 0) return;
  v1::JobAttempt* a = after->status.mutable_attempts(after->status.attempts_size() - 1);
  a->set_preempted_by(stop.for_job);
  host_->UpdateProgress(*after, "", {});
}

void PlannedStops::CheckDeadlines(absl::Time now) {
  for (const std::string& id : host_->LiveJobIds()) {
    LiveJob& job = *host_->FindJob(id);
    if (!job.attempt.planned_stop || now < job.attempt.planned_stop->deadline) continue;
    STAGEWISE_LOG(WARNING) << "job " << id << ": the checkpoint planned for \""
                           << job.attempt.planned_stop->reason << "\" was not committed within "
                           << kTimeout << "; going on without it";
    const std::string reason = job.attempt.planned_stop->reason;
    job.attempt.planned_stop.reset();
    host_->UpdateProgress(
        job, absl::StrCat(reason, ": no checkpoint within ", absl::FormatDuration(kTimeout)), {});
  }
}

}  // namespace stagewise::coordinator
