#include "coordinator/event_admission.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/common/retry_policy.h"

namespace stagewise::coordinator {
namespace {

// Spans one trace chunk may carry (as many as a whole job keeps, JobManager::kMaxTraceSpans).
constexpr int kMaxSpansPerChunk = 150000;

Admission Take() { return {}; }

Admission Refuse(std::string label, std::string why) {
  return {Admission::Verdict::kRefuse, std::move(label), std::move(why)};
}

// Reports whose values became summary entries and metric series: bounded.
bool BadValues(const google::protobuf::Map<std::string, double>& values) {
  if (values.size() > 64) return true;
  for (const auto& [key, value] : values) {
    if (key.size() > 64) return true;
  }
  return false;
}

// What a metrics report's values may be, and which stage may send them. The
// head (the job's last stage) owns the training loss and every evaluation
// number (worker/algorithms/common.cc, RunEvaluation); any stage reports its
// step, samples and timing. Losses are cross-entropies (>= 0), accuracies
// fractions. Non-finite values are not judged here: they are dropped one by
// one (WithoutNonFinite), a diverged job's loss included.
constexpr double kMaxLoss = 1e30;
constexpr double kMaxCount = 1e15;
struct MetricRule {
  const char* name;
  bool head_only;
  double low, high;
};
constexpr MetricRule kMetricRules[] = {
    {"train_loss", true, 0, kMaxLoss},
    {"eval_loss", true, 0, kMaxLoss},
    {"eval_accuracy", true, 0, 1},
    {"eval_samples", true, 0, kMaxCount},
    {"samples", false, 0, kMaxCount},
    {"report_seconds", false, 0, kMaxCount},
    {"compute_seconds", false, 0, kMaxCount},
};

Admission CheckMetricValues(const v1::MetricsReport& m, int stage, const LiveJob& job) {
  const bool head = stage == NumStages(job) - 1;
  for (const MetricRule& rule : kMetricRules) {
    const auto it = m.values().find(rule.name);
    if (it == m.values().end()) continue;
    if (rule.head_only && !head) {
      return Refuse("wrong_stage", absl::StrCat(rule.name, " from stage ", stage, " of ",
                                                NumStages(job), ": only the last stage has it"));
    }
    const double v = it->second;
    if (std::isfinite(v) && (v < rule.low || v > rule.high)) {
      return Refuse("out_of_range", absl::StrCat(rule.name, " ", v, " is outside [", rule.low, ", ",
                                                 rule.high, "]"));
    }
  }
  return Take();
}

// Whether attempt `attempt` ended on a neighbour's broken stream (a
// secondary report: the stage that broke it may not have told its cause yet).
bool EndedOnABrokenStream(const LiveJob& job, int attempt) {
  for (const v1::JobAttempt& a : job.status.attempts()) {
    if (a.attempt() == attempt) return a.end_reason_secondary();
  }
  return false;
}

// An event of an ended attempt, from the worker that ran its stage then. The
// cause of the previous attempt's end, when it is not retryable, fails the
// job: while it recovers, or later when the attempt ended only on a broken
// stream (the cause came after the report of its consequence).
Admission Stale(const v1::WorkerEvent& event, const LiveJob& job) {
  if (event.has_error() && event.attempt() == job.attempt_number - 1 &&
      (job.status.state() == v1::RECOVERING || EndedOnABrokenStream(job, event.attempt())) &&
      !IsRetryable(event.error()) &&
      event.error().code() != static_cast<int>(absl::StatusCode::kCancelled) &&
      event.error().code() != static_cast<int>(absl::StatusCode::kDataLoss)) {
    return {Admission::Verdict::kFailJob, "", event.error().message()};
  }
  return {Admission::Verdict::kDropStale, "", ""};
}

// The numbers of an event from the stage's own worker.
Admission CheckRanges(const v1::WorkerEvent& event, const LiveJob& job) {
  const int64_t total = job.status.total_steps();
  auto out_of_range = [](std::string why) { return Refuse("out_of_range", std::move(why)); };
  switch (event.event_case()) {
    case v1::WorkerEvent::kMetrics:
      if (event.metrics().step() < 0 || event.metrics().step() > total) {
        return out_of_range("step out of range");
      }
      // Non-finite values are dropped one by one (WithoutNonFinite), not the
      // whole report: a result whose summary holds a NaN must still end its
      // stage.
      if (BadValues(event.metrics().values())) return out_of_range("too many or too long values");
      return CheckMetricValues(event.metrics(), event.stage(), job);
    case v1::WorkerEvent::kResult:
      if (BadValues(event.result().values())) return out_of_range("too many or too long values");
      return Take();
    case v1::WorkerEvent::kPhaseDone:
      if (event.phase_done().phase() != job.status.phase()) {
        return out_of_range(absl::StrCat("phase ", event.phase_done().phase(),
                                         " is not the job's current phase ", job.status.phase()));
      }
      // Once per (stage, replica) and phase: a repeat moves nothing (and
      // must not pass for progress with the stall watchdog).
      if (const auto done = job.attempt.phase_done.find(event.phase_done().phase());
          done != job.attempt.phase_done.end() &&
          done->second.count(SlotOf(job, event.stage(), event.replica())) > 0) {
        return Refuse("repeated", absl::StrCat("stage ", event.stage(), " already finished phase ",
                                               event.phase_done().phase()));
      }
      return Take();
    case v1::WorkerEvent::kCheckpointSaved: {
      const v1::CheckpointSaved& c = event.checkpoint_saved();
      if (c.step() < 0 || c.step() > total || c.bytes() < 0) {
        return out_of_range("step or size out of range");
      }
      if (!(c.seconds() >= 0 && c.seconds() <= 1e7)) return out_of_range("seconds out of range");
      if (c.phase() < 0 || c.phase() >= std::max(1, job.status.num_phases())) {
        return out_of_range("phase out of range");
      }
      return Take();
    }
    case v1::WorkerEvent::kCheckpointPlanned:
      if (event.checkpoint_planned().step() <= 0 || event.checkpoint_planned().step() > total) {
        return out_of_range("step out of range");
      }
      return Take();
    case v1::WorkerEvent::kTrace:
      if (!job.spec.trace.enabled) return out_of_range("the job does not trace");
      if (event.trace().spans_size() > kMaxSpansPerChunk) {
        return out_of_range("too many spans in one chunk");
      }
      return Take();
    default:
      return Take();
  }
}

}  // namespace

bool IsRetryable(const v1::StageError& error) {
  return error.retryable() || IsTransient(static_cast<absl::StatusCode>(error.code()));
}

int EventAttempt(const v1::WorkerEvent& event) {
  switch (event.event_case()) {
    case v1::WorkerEvent::kMetrics:
    case v1::WorkerEvent::kResult:
    case v1::WorkerEvent::kPhaseDone:
    case v1::WorkerEvent::kCheckpointSaved:
    case v1::WorkerEvent::kCheckpointPlanned:
    case v1::WorkerEvent::kTrace:
    case v1::WorkerEvent::kReplayDone:
      return event.attempt();
    case v1::WorkerEvent::kError:
      // Profiling and configuration errors (stage -1) belong to no attempt.
      return event.stage() < 0 ? -1 : event.attempt();
    default:
      return -1;
  }
}

Admission AdmitEvent(const v1::WorkerEvent& event, const LiveJob* job) {
  if (event.has_ack() || event.has_heartbeat()) return Take();
  const std::string& sender = event.worker_id();
  if (job == nullptr) return Refuse("unknown_job", "no such live job");  // also a just-ended job's
  if (const int attempt = EventAttempt(event); attempt >= 0 && attempt != job->attempt_number) {
    // Only the worker that ran the error's stage in that attempt is heard.
    for (const v1::JobAttempt& a : job->status.attempts()) {
      const int slot = SlotOf(*job, event.stage(), event.replica());
      if (event.has_error() && a.attempt() == attempt && event.stage() >= 0 &&
          event.stage() < NumStages(*job) && event.replica() >= 0 && slot < a.workers_size() &&
          a.workers(slot) == sender) {
        return Stale(event, *job);
      }
    }
    return Refuse("stale_attempt",
                  absl::StrCat("attempt ", attempt, " of job ", event.job_id(), " is over"));
  }
  const auto& workers = job->attempt.workers;
  if (std::find(workers.begin(), workers.end(), sender) == workers.end()) {
    return Refuse("not_assigned", absl::StrCat("the sender runs no stage of job ", event.job_id()));
  }
  if (event.has_profile()) {
    return job->status.state() == v1::PROFILING
               ? Take()
               : Refuse("not_assigned", "the job is not profiling");
  }
  // A profiling or configuration error (no stage): any member may send it.
  if (event.has_error() && event.stage() < 0) return Take();
  const int stage = event.stage(), replica = event.replica();
  if (stage < 0 || stage >= NumStages(*job) || replica < 0 || replica >= NumReplicas(*job) ||
      SlotOf(*job, stage, replica) >= static_cast<int>(workers.size()) ||
      workers[SlotOf(*job, stage, replica)] != sender) {
    return Refuse("not_assigned",
                  absl::StrCat("the sender does not run stage ", stage,
                               replica > 0 ? absl::StrCat(" replica ", replica) : "", " of job ",
                               event.job_id()));
  }
  return CheckRanges(event, *job);
}

}  // namespace stagewise::coordinator
