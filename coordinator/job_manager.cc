#include "coordinator/job_manager.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "services/common/log.h"
#include "services/common/status_macros.h"
#include "services/common/utf8.h"
#include "services/data/sizes.h"
#include "services/models/plan.h"

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

// Errors that another attempt may get past: a peer, the network or a worker
// went away. Everything else is deterministic (docs/fault_tolerance.md).
bool Retryable(const v1::StageError& e) {
  const auto code = static_cast<absl::StatusCode>(e.code());
  return e.retryable() || code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kAborted || code == absl::StatusCode::kDeadlineExceeded;
}

// The job event's attempt, or -1 for events without one.
int EventAttempt(const v1::WorkerEvent& event) {
  switch (event.event_case()) {
    case v1::WorkerEvent::kMetrics:
      return event.metrics().attempt();
    case v1::WorkerEvent::kResult:
      return event.result().attempt();
    case v1::WorkerEvent::kPhaseDone:
      return event.phase_done().attempt();
    case v1::WorkerEvent::kCheckpointSaved:
      return event.checkpoint_saved().attempt();
    case v1::WorkerEvent::kTrace:
      return event.trace().attempt();
    case v1::WorkerEvent::kError:
      // Profiling errors (stage -1) belong to no attempt.
      return event.error().stage() < 0 ? -1 : event.error().attempt();
    default:
      return -1;
  }
}

std::string EventJob(const v1::WorkerEvent& event) {
  switch (event.event_case()) {
    case v1::WorkerEvent::kMetrics:
      return event.metrics().job_id();
    case v1::WorkerEvent::kResult:
      return event.result().job_id();
    case v1::WorkerEvent::kPhaseDone:
      return event.phase_done().job_id();
    case v1::WorkerEvent::kCheckpointSaved:
      return event.checkpoint_saved().job_id();
    case v1::WorkerEvent::kTrace:
      return event.trace().job_id();
    case v1::WorkerEvent::kError:
      return event.error().job_id();
    default:
      return "";
  }
}

}  // namespace

JobManager::JobManager(JobStore* store, metrics::CoordinatorMetrics* metrics,
                       JobManagerOptions options)
    : store_(store), metrics_(metrics), options_(options) {}

JobManager::~JobManager() { Stop(); }

// --- Start, Stop and the loop ---------------------------------------------

absl::Status JobManager::Start() {
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<JobRecord> unfinished, store_->UnfinishedJobs());
  // No loop yet: this thread owns the loop's state until the loop starts.
  for (const JobRecord& rec : unfinished) {
    const std::string& id = rec.status.job_id();
    auto spec = ParseJobSpec(rec.spec_yaml);
    auto blocks = spec.ok() ? models::PlanModel(spec->model)
                            : absl::StatusOr<std::vector<models::BlockInfo>>(spec.status());
    auto ranges = blocks.ok() ? models::ResolvePartition(spec->stages, *blocks)
                              : absl::StatusOr<std::vector<std::pair<int, int>>>(blocks.status());
    if (!ranges.ok()) {
      (void)Transition(id, v1::FAILED, std::string(ranges.status().message()));
      continue;
    }
    Job job = NewJob(rec.status, *spec, rec.spec_yaml, *blocks, *ranges);
    job.attempt = rec.status.attempt();
    for (const v1::JobAttempt& a : rec.status.attempts()) {
      job.max_step = std::max(job.max_step, a.reached_step());
    }
    job.max_step = std::max(job.max_step, rec.status.step());
    const v1::JobState state = rec.status.state();
    if (state == v1::PENDING || state == v1::PROFILING) {
      // Not placed yet (or only profiling): queue it again as it was.
      if (state == v1::PROFILING) {
        jobs_.emplace(id, std::move(job));
        if (!Transition(id, v1::PENDING, "the coordinator restarted while the job was PROFILING")
                 .ok()) {
          jobs_.erase(id);
          continue;
        }
      } else {
        jobs_.emplace(id, std::move(job));
        Publish(rec.status, "");
      }
      Job& queued = jobs_.at(id);
      scheduler_.Enqueue({id, static_cast<int>(queued.ranges.size()), queued.needs_plan});
      continue;
    }
    // It was placed: its stages stopped when they lost this coordinator.
    // Resume it from its newest committed checkpoint.
    jobs_.emplace(id, std::move(job));
    const std::string why =
        absl::StrCat("the coordinator restarted while the job was ", v1::JobState_Name(state));
    if (state == v1::RECOVERING) {
      QueueRecovery(id, jobs_.at(id), why);
    } else {
      Recover(id, why, "coordinator_restart");
    }
  }
  RefreshGauges();
  {
    absl::MutexLock lock(&queue_mu_);
    if (running_ || stopping_) return absl::FailedPreconditionError("JobManager: started twice");
    running_ = true;
  }
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void JobManager::Stop() {
  {
    absl::MutexLock lock(&queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
}

bool JobManager::Post(Task task) {
  absl::MutexLock lock(&queue_mu_);
  if (!running_ || stopping_) return false;
  // The loop itself never waits for room (it is the one making room).
  if (std::this_thread::get_id() != loop_id_) {
    queue_mu_.Await(absl::Condition(this, &JobManager::HasRoomLocked));
    if (stopping_) return false;
  }
  queue_.push_back(std::move(task));
  return true;
}

bool JobManager::RunOnLoop(Task task) {
  bool on_loop = false;
  {
    absl::MutexLock lock(&queue_mu_);
    on_loop = running_ && std::this_thread::get_id() == loop_id_;
  }
  if (on_loop) {
    task();
    return true;
  }
  auto done = std::make_shared<absl::Notification>();
  if (!Post([task = std::move(task), done] {
        task();
        done->Notify();
      })) {
    return false;
  }
  // Stop runs every task queued before it, so this always returns.
  done->WaitForNotification();
  return true;
}

void JobManager::Loop() {
  {
    absl::MutexLock lock(&queue_mu_);
    loop_id_ = std::this_thread::get_id();
  }
  for (;;) {
    const absl::Time deadline = NextDeadline();
    std::deque<Task> tasks;
    bool stopping = false;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.AwaitWithDeadline(absl::Condition(this, &JobManager::HasWorkLocked), deadline);
      tasks.swap(queue_);
      stopping = stopping_;
    }
    for (Task& task : tasks) {
      task();
      ScheduleIfNeeded();
      if (absl::Now() >= flush_due_) FlushProgress();
    }
    Housekeeping(absl::Now());
    ScheduleIfNeeded();
    bool idle = false;
    {
      absl::MutexLock lock(&queue_mu_);
      idle = queue_.empty();
    }
    if (idle) FlushProgress();  // the queue ran dry: write the batch now
    RefreshGauges();
    if (stopping && idle) break;
  }
  FlushProgress();
}

absl::Time JobManager::NextDeadline() const {
  absl::Time deadline = absl::Now() + options_.housekeeping;
  // Expire() needs strictly more than the timeout of silence.
  deadline =
      std::min(deadline, registry_.NextExpiry(options_.heartbeat_timeout) + absl::Milliseconds(1));
  deadline = std::min(deadline, flush_due_);
  if (!metrics_expiry_.empty()) deadline = std::min(deadline, metrics_expiry_.front().first);
  for (const auto& [id, job] : jobs_) {
    deadline = std::min({deadline, job.recovery_deadline, job.configure_deadline});
  }
  return deadline;
}

void JobManager::Housekeeping(absl::Time now) {
  for (const WorkerRegistry::Removed& lost : registry_.Expire(now, options_.heartbeat_timeout)) {
    OnWorkerLost(
        lost, absl::StrCat("no heartbeat for ", absl::FormatDuration(options_.heartbeat_timeout)));
  }
  CheckDeadlines(now);
  if (now >= flush_due_) FlushProgress();
  while (!metrics_expiry_.empty() && metrics_expiry_.front().first <= now) {
    metrics_->RemoveJob(metrics_expiry_.front().second);
    metrics_expiry_.pop_front();
  }
}

// --- Clients ----------------------------------------------------------------

JobManager::Job JobManager::NewJob(const v1::JobStatus& status, const JobSpec& spec,
                                   const std::string& yaml,
                                   const std::vector<models::BlockInfo>& blocks,
                                   const std::vector<std::pair<int, int>>& ranges) {
  Job job;
  job.status = status;
  job.spec = spec;
  job.yaml = yaml;
  job.ranges = ranges;
  const bool reversible = std::any_of(blocks.begin(), blocks.end(),
                                      [](const models::BlockInfo& b) { return b.reversible; });
  // An auto partition, or auto modes under a budget, need a profile first.
  job.needs_plan =
      spec.stages.partition == Partition::kAuto ||
      (reversible && spec.stages.modes == BlockModes::kAuto && spec.stages.memory_budget > 0);
  if (!job.needs_plan && reversible && spec.stages.modes != BlockModes::kAuto) {
    for (const auto& [b, e] : ranges) {
      std::vector<std::string> modes;
      for (int i = b; i < e; ++i) {
        modes.emplace_back(NameOf(blocks[i].reversible ? spec.stages.modes : BlockModes::kStore));
      }
      job.modes.push_back(std::move(modes));
    }
  }
  return job;
}

absl::StatusOr<std::string> JobManager::Submit(const std::string& yaml, const std::string& owner) {
  {
    // The view holds every live job: count the owner's.
    absl::MutexLock lock(&view_mu_);
    int live = 0;
    for (const auto& [id, st] : view_) live += st.owner() == owner ? 1 : 0;
    if (live >= options_.max_live_jobs_per_owner) {
      metrics_->CountRefused("too_many_jobs");
      return absl::ResourceExhaustedError(
          absl::StrCat("'", owner.empty() ? "anonymous" : owner, "' has ", live,
                       " jobs that have not ended; at most ", options_.max_live_jobs_per_owner,
                       " (wait for some, or cancel)"));
    }
  }
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(yaml);
  if (!parsed.ok()) {
    metrics_->CountRefused("bad_spec");
    return parsed.status();
  }
  JobSpec spec = std::move(*parsed);
  // ParseJobSpec accepts only the algorithms of AlgorithmOptions
  // (services/spec/job_spec.h), each of which every worker constructs.
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<models::BlockInfo> blocks, models::PlanModel(spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(auto ranges, models::ResolvePartition(spec.stages, blocks));
  const int64_t per_epoch = data::NominalTrainSize(spec.data) / spec.batch_size;
  if (per_epoch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec.batch_size, " is larger than the training set"));
  }
  if (!spec.checkpoint.dir.empty()) {
    if (auto dir = ConfinePath("checkpoint.dir", spec.checkpoint.dir, options_.checkpoint_roots);
        !dir.ok()) {
      return dir.status();
    }
    // The coordinator writes the manifests: it must reach checkpoint.dir too.
    if (absl::Status s = checkpoint::ProbeWritable(spec.checkpoint.dir); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(s.message(),
                       " (the coordinator commits checkpoints there: mount the same volume on "
                       "the coordinator and every worker)"));
    }
  }
  {
    absl::MutexLock lock(&queue_mu_);
    if (!running_ || stopping_) {
      return absl::UnavailableError("the coordinator is not running (starting or shutting down)");
    }
  }
  JobRecord record;
  record.spec_yaml = yaml;
  v1::JobStatus& st = record.status;
  st.set_job_id(store_->NewJobId());
  st.set_name(spec.name);
  st.set_owner(owner);
  st.set_state(v1::PENDING);
  st.set_algorithm(spec.algorithm.name());
  const std::vector<PhaseSpec> phases = Phases(spec);
  st.set_num_phases(static_cast<int>(phases.size()));
  st.set_phase(0);
  st.set_phase_name(phases.front().name);
  st.set_num_stages(static_cast<int>(ranges.size()));
  st.set_total_steps(data::TotalSteps(spec, per_epoch));
  st.set_created_unix_ms(NowMs());
  st.set_updated_unix_ms(st.created_unix_ms());
  st.set_last_checkpoint_step(-1);
  // The one durable write of a submission, on the caller's thread, no lock held.
  STAGEWISE_RETURN_IF_ERROR(store_->CreateJob(record));
  Publish(st, "");  // visible to GetJob / WatchJob before the id is returned
  Job job = NewJob(st, spec, yaml, blocks, ranges);
  if (!Post([this, job = std::move(job)]() mutable { Admit(std::move(job)); })) {
    // Stopping: the job stays PENDING in the store; the next Start queues it.
    STAGEWISE_LOG(WARNING) << "job " << st.job_id() << " submitted while stopping; kept PENDING";
  }
  return st.job_id();
}

void JobManager::Admit(Job job) {
  const std::string id = job.status.job_id();
  metrics_->CountTransition("PENDING");
  scheduler_.Enqueue({id, static_cast<int>(job.ranges.size()), job.needs_plan && !job.planned});
  jobs_.emplace(id, std::move(job));
  schedule_needed_ = true;
}

absl::StatusOr<v1::JobStatus> JobManager::GetJob(const std::string& job_id) const {
  {
    absl::MutexLock lock(&view_mu_);
    auto it = view_.find(job_id);
    if (it != view_.end()) return it->second;
  }
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  return rec.status;
}

absl::StatusOr<std::vector<v1::JobStatus>> JobManager::ListJobs(int limit) const {
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<v1::JobStatus> jobs, store_->ListJobs(limit));
  // Live jobs' progress may be newer than its last batched write.
  absl::MutexLock lock(&view_mu_);
  for (v1::JobStatus& job : jobs) {
    auto it = view_.find(job.job_id());
    if (it != view_.end()) job = it->second;
  }
  return jobs;
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& job_id,
                                                 const std::string& reason) {
  // Kept and sent as a proto string: valid UTF-8 whatever an embedder passes.
  const std::string why = reason.empty() ? "cancelled by the user" : ToValidUtf8(reason);
  absl::StatusOr<v1::JobStatus> result = absl::UnavailableError("the coordinator is stopping");
  RunOnLoop([&] { result = CancelJob(job_id, why); });
  return result;
}

absl::StatusOr<v1::JobStatus> JobManager::CancelJob(const std::string& job_id,
                                                    const std::string& reason) {
  if (jobs_.count(job_id)) EndJob(job_id, v1::CANCELLED, reason);
  // Finished (or unknown: NOT_FOUND) jobs answer with their stored status.
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  return rec.status;
}

std::vector<v1::WorkerInfo> JobManager::ListWorkers() const { return registry_.List(); }

absl::StatusOr<v1::ListCheckpointsResponse> JobManager::ListCheckpoints(
    const std::string& job_id) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  STAGEWISE_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(rec.spec_yaml));
  v1::ListCheckpointsResponse out;
  if (spec.checkpoint.dir.empty()) return out;
  out.set_dir(checkpoint::JobDir(spec.checkpoint.dir, job_id));
  std::vector<std::string> skipped;
  for (const checkpoint::Committed& c :
       checkpoint::ListCommitted(spec.checkpoint.dir, job_id, false, &skipped)) {
    v1::CheckpointInfo* info = out.add_checkpoints();
    info->set_step(c.manifest.step());
    info->set_phase(c.manifest.phase());
    info->set_created_unix_ms(c.manifest.created_unix_ms());
    info->set_bytes(c.bytes);
    info->set_manifest_path(c.dir + "/" + checkpoint::kManifestName);
    info->set_num_shards(c.manifest.shards_size());
  }
  for (std::string& line : skipped) out.add_skipped(std::move(line));
  return out;
}

absl::StatusOr<v1::JobMetrics> JobManager::JobMetrics(const std::string& job_id,
                                                      const std::vector<std::string>& names,
                                                      int max_points) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  (void)rec;
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<MetricPoint> points, store_->Metrics(job_id));
  const size_t cap = max_points > 0 ? static_cast<size_t>(max_points) : 5000;
  std::map<std::string, std::vector<const MetricPoint*>> by_name;
  for (const MetricPoint& p : points) {
    if (!names.empty() && std::find(names.begin(), names.end(), p.name) == names.end()) continue;
    by_name[p.name].push_back(&p);
  }
  v1::JobMetrics out;
  out.set_job_id(job_id);
  for (const auto& [name, series] : by_name) {
    const size_t n = series.size();
    for (size_t k = 0; k < std::min(n, cap); ++k) {
      // Evenly spaced indices from the first to the last point.
      const size_t i = n <= cap ? k : (cap == 1 ? n - 1 : k * (n - 1) / (cap - 1));
      v1::MetricSample* s = out.add_samples();
      s->set_step(series[i]->step);
      s->set_name(name);
      s->set_value(series[i]->value);
      s->set_unix_ms(series[i]->unix_ms);
    }
  }
  return out;
}

absl::StatusOr<int64_t> JobManager::Subscribe(const std::string& job_id, Listener listener) {
  v1::JobEvent first;
  {
    absl::MutexLock lock(&view_mu_);
    auto it = view_.find(job_id);
    if (it != view_.end()) {
      *first.mutable_status() = it->second;
      listener(first);
      const int64_t id = next_subscription_++;
      listeners_[id] = {job_id, std::move(listener)};
      return id;
    }
  }
  // Not live: finished (its last event is its stored status) or unknown.
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  absl::MutexLock lock(&view_mu_);
  auto it = view_.find(job_id);
  *first.mutable_status() = it != view_.end() ? it->second : rec.status;
  listener(first);
  const int64_t id = next_subscription_++;
  listeners_[id] = {job_id, std::move(listener)};
  return id;
}

void JobManager::Unsubscribe(int64_t subscription) {
  absl::MutexLock lock(&view_mu_);
  listeners_.erase(subscription);
}

void JobManager::Publish(const v1::JobStatus& status, const std::string& message) {
  v1::JobEvent event;
  *event.mutable_status() = status;
  event.set_message(message);
  absl::MutexLock lock(&view_mu_);
  if (IsTerminal(status.state())) {
    view_.erase(status.job_id());
  } else {
    view_[status.job_id()] = status;
  }
  for (auto& [id, entry] : listeners_) {
    if (entry.first == status.job_id()) entry.second(event);
  }
}

// --- Workers (gRPC threads) ------------------------------------------------

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
    Post([this, lost = *replaced] { OnWorkerLost(lost, "it registered again (restarted?)"); });
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
  Post([this] { schedule_needed_ = true; });
  return absl::OkStatus();
}

void JobManager::Disconnect(const std::string& worker_id, CommandSink* sink,
                            const absl::Status& why) {
  std::optional<WorkerRegistry::Removed> removed = registry_.Disconnect(worker_id, sink);
  if (!removed.has_value()) return;
  Post([this, lost = *removed, why = std::string(why.message())] {
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
  switch (event.event_case()) {
    case v1::WorkerEvent::kAck:
    case v1::WorkerEvent::kMetrics:
    case v1::WorkerEvent::kResult:
    case v1::WorkerEvent::kPhaseDone:
    case v1::WorkerEvent::kProfile:
    case v1::WorkerEvent::kError:
    case v1::WorkerEvent::kCheckpointSaved:
    case v1::WorkerEvent::kTrace:
      Post([this, event] { HandleEvent(event); });
      return;
    default:
      return;  // a heartbeat: Touch was all of it
  }
}

// --- Loop thread: events ----------------------------------------------------

std::string JobManager::Refusal(const v1::WorkerEvent& event, std::string* reason) const {
  const std::string& sender = event.worker_id();
  *reason = "not_assigned";
  if (event.has_ack()) return "";  // OnAck matches it to the command it answers
  const std::string job_id = event.has_profile() ? event.profile().job_id() : EventJob(event);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    *reason = "unknown_job";  // also the late events of a job that just ended
    return "no such live job";
  }
  const Job& job = it->second;
  if (const int attempt = EventAttempt(event); attempt >= 0 && attempt != job.attempt) {
    // An event of an ended attempt (HandleEvent drops all but a root-cause
    // error): it must come from the worker that ran that stage then.
    const int stage = event.has_error() ? event.error().stage() : -1;
    for (const v1::JobAttempt& a : job.status.attempts()) {
      if (a.attempt() == attempt && stage >= 0 && stage < a.workers_size() &&
          a.workers(stage) == sender) {
        return "";
      }
    }
    *reason = "stale_attempt";
    return absl::StrCat("attempt ", attempt, " of job ", job_id, " is over");
  }
  const auto& workers = job.workers;
  const bool member = std::find(workers.begin(), workers.end(), sender) != workers.end();
  if (!member) return absl::StrCat("the sender runs no stage of job ", job_id);
  if (event.has_profile()) {
    return job.status.state() == v1::PROFILING ? "" : "the job is not profiling";
  }
  int stage = -1;
  switch (event.event_case()) {
    case v1::WorkerEvent::kMetrics:
      stage = event.metrics().stage();
      break;
    case v1::WorkerEvent::kResult:
      stage = event.result().stage();
      break;
    case v1::WorkerEvent::kPhaseDone:
      stage = event.phase_done().stage();
      break;
    case v1::WorkerEvent::kCheckpointSaved:
      stage = event.checkpoint_saved().stage();
      break;
    case v1::WorkerEvent::kTrace:
      stage = event.trace().stage();
      break;
    case v1::WorkerEvent::kError:
      stage = event.error().stage();
      if (stage < 0) return "";  // a profiling or configuration error: any member may send it
      break;
    default:
      return "";
  }
  if (stage < 0 || stage >= static_cast<int>(workers.size()) || workers[stage] != sender) {
    return absl::StrCat("the sender does not run stage ", stage, " of job ", job_id);
  }
  *reason = "out_of_range";
  const int64_t total = job.status.total_steps();
  // Non-finite values from the assigned worker are dropped one by one
  // (WithoutNonFinite), not the whole report: a result whose summary holds a
  // NaN must still end its stage.
  auto bad_values = [](const google::protobuf::Map<std::string, double>& values) {
    if (values.size() > 64) return true;
    for (const auto& [key, value] : values) {
      if (key.size() > 64) return true;
    }
    return false;
  };
  switch (event.event_case()) {
    case v1::WorkerEvent::kMetrics:
      if (event.metrics().step() < 0 || event.metrics().step() > total) return "step out of range";
      if (bad_values(event.metrics().values())) return "too many or too long values";
      return "";
    case v1::WorkerEvent::kResult:
      if (bad_values(event.result().values())) return "too many or too long values";
      return "";
    case v1::WorkerEvent::kPhaseDone:
      if (event.phase_done().phase() != job.status.phase()) {
        return absl::StrCat("phase ", event.phase_done().phase(),
                            " is not the job's current phase ", job.status.phase());
      }
      return "";
    case v1::WorkerEvent::kCheckpointSaved: {
      const v1::CheckpointSaved& c = event.checkpoint_saved();
      if (c.step() < 0 || c.step() > total || c.bytes() < 0) return "step or size out of range";
      if (c.phase() < 0 || c.phase() >= std::max(1, job.status.num_phases())) {
        return "phase out of range";
      }
      return "";
    }
    case v1::WorkerEvent::kTrace:
      if (!job.spec.trace.enabled) return "the job does not trace";
      if (event.trace().spans_size() > kMaxTraceSpans) return "too many spans in one chunk";
      return "";
    default:
      return "";
  }
}

namespace {

// A copy of a report without its NaN and infinite values (a diverged job's
// loss, say): they would corrupt the job's status and history. The worker
// itself fails a stage whose training loss stops being finite.
template <typename Report>
Report WithoutNonFinite(const Report& report) {
  Report out = report;
  auto* values = out.mutable_values();
  for (auto it = values->begin(); it != values->end();) {
    it = std::isfinite(it->second) ? std::next(it) : values->erase(it);
  }
  return out;
}

}  // namespace

void JobManager::HandleEvent(const v1::WorkerEvent& event) {
  std::string reason;
  if (const std::string why = Refusal(event, &reason); !why.empty()) {
    metrics_->CountRefused(reason);
    // Late traffic of ended jobs and attempts is normal: not worth a line.
    if (reason == "unknown_job" || reason == "stale_attempt") return;
    // Bounded logging: a misbehaving peer must not flood the log.
    if (++refused_events_ <= 20 || refused_events_ % 1000 == 0) {
      STAGEWISE_LOG(WARNING) << "ignoring an event (case " << event.event_case() << ") from worker "
                             << event.worker_id() << ": " << why << " (" << refused_events_
                             << " ignored so far)";
    }
    return;
  }
  if (const int attempt = EventAttempt(event); attempt >= 0) {
    auto it = jobs_.find(EventJob(event));
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (attempt != job.attempt) {
      // An abandoned attempt. Only its root cause still matters: a
      // deterministic error that ended it (its peers' broken streams may have
      // been reported first) would fail the next attempt the same way.
      if (event.has_error() && attempt == job.attempt - 1 && job.status.state() == v1::RECOVERING &&
          !Retryable(event.error()) &&
          event.error().code() != static_cast<int>(absl::StatusCode::kCancelled) &&
          event.error().code() != static_cast<int>(absl::StatusCode::kDataLoss)) {
        EndJob(it->first, v1::FAILED, event.error().message());
      }
      return;
    }
  }
  switch (event.event_case()) {
    case v1::WorkerEvent::kCheckpointSaved:
      return OnCheckpointSaved(event.checkpoint_saved());
    case v1::WorkerEvent::kTrace:
      return OnTrace(event.trace());
    case v1::WorkerEvent::kAck:
      return OnAck(event.ack(), event.worker_id());
    case v1::WorkerEvent::kMetrics:
      return OnMetrics(WithoutNonFinite(event.metrics()));
    case v1::WorkerEvent::kResult:
      return OnResult(WithoutNonFinite(event.result()));
    case v1::WorkerEvent::kPhaseDone:
      return OnPhaseDone(event.phase_done());
    case v1::WorkerEvent::kProfile:
      return OnProfile(event.profile());
    case v1::WorkerEvent::kError:
      return OnError(event.error());
    default:
      return;
  }
}

void JobManager::OnAck(const v1::Ack& ack, const std::string& sender) {
  for (auto& [id, job] : jobs_) {
    auto pending = job.pending_acks.find(ack.command_id());
    if (pending == job.pending_acks.end()) continue;
    if (pending->second != sender) return;  // not the worker the command went to
    job.pending_acks.erase(pending);
    if (!job.pending_acks.empty() || job.status.state() != v1::CONFIGURING) return;
    const std::string job_id = id;  // `id` dies if the transition ends the job
    if (!Transition(job_id, v1::RUNNING, "").ok()) return;
    Job& running = jobs_.at(job_id);
    running.started = absl::Now();
    running.configure_deadline = absl::InfiniteFuture();
    const int phase = running.resume ? running.resume->manifest.phase() : 0;
    const int64_t from = running.resume ? running.resume->manifest.step() : 0;
    if (running.attempt_ended != absl::InfinitePast()) {
      metrics_->ObserveRecovery(absl::ToDoubleSeconds(running.started - running.attempt_ended));
      running.attempt_ended = absl::InfinitePast();
    }
    for (const std::string& worker : running.workers) {
      Send(worker, StartCommand(job_id, phase, from));
    }
    return;
  }
}

void JobManager::OnTrace(const v1::TraceChunk& chunk) {
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

absl::StatusOr<v1::JobTrace> JobManager::JobTrace(const std::string& job_id) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<v1::TraceChunk> chunks, store_->Trace(job_id));
  v1::JobTrace out;
  out.set_job_id(job_id);
  out.set_name(rec.status.name());
  out.set_algorithm(rec.status.algorithm());
  out.set_num_stages(rec.status.num_stages());
  // Chunks of one stage and attempt go together, onto the coordinator's clock.
  std::map<std::pair<int, int>, v1::StageTrace> by_stage;
  for (const v1::TraceChunk& c : chunks) {
    const bool first = by_stage.count({c.stage(), c.attempt()}) == 0;
    v1::StageTrace& st = by_stage[{c.stage(), c.attempt()}];
    st.set_stage(c.stage());
    st.set_attempt(c.attempt());
    // -1: no estimate (offset 0) in some chunk.
    const bool unknown = st.clock_rtt_us() < 0 || c.clock_rtt_us() < 0;
    st.set_clock_rtt_us(first ? c.clock_rtt_us()
                              : (unknown ? -1 : std::max(st.clock_rtt_us(), c.clock_rtt_us())));
    st.set_dropped(std::max(st.dropped(), c.dropped()));
    out.set_dropped_at_coordinator(out.dropped_at_coordinator() + c.refused());
    for (const v1::Span& s : c.spans()) {
      v1::Span* span = st.add_spans();
      *span = s;
      span->set_start_us(s.start_us() + c.clock_offset_us());
    }
  }
  for (auto& [key, st] : by_stage) *out.add_stages() = std::move(st);
  return out;
}

void JobManager::OnMetrics(const v1::MetricsReport& m) {
  auto it = jobs_.find(m.job_id());
  if (it == jobs_.end() || it->second.workers.empty()) return;
  Job& job = it->second;
  v1::JobStatus& st = job.status;
  std::vector<MetricPoint> points;
  const int64_t now_ms = NowMs();
  const bool last_stage = m.stage() == static_cast<int>(job.workers.size()) - 1;
  if (last_stage && m.values().count("train_loss")) {
    st.set_step(m.step());
    job.max_step = std::max(job.max_step, m.step());
    if (st.attempts_size() > 0)
      st.mutable_attempts(st.attempts_size() - 1)->set_reached_step(m.step());
    const int64_t per_epoch = data::NominalTrainSize(job.spec.data) / job.spec.batch_size;
    st.set_epoch(static_cast<int>(m.step() / std::max<int64_t>(1, per_epoch)));
    st.set_train_loss(m.values().at("train_loss"));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - job.started);
    if (seconds > 0) {
      const int64_t from = job.resume ? job.resume->manifest.step() : 0;
      st.set_samples_per_second(static_cast<double>((m.step() - from) * job.spec.batch_size) /
                                seconds);
    }
    points.push_back({m.step(), "train_loss", st.train_loss(), now_ms});
    points.push_back({m.step(), "samples_per_second", st.samples_per_second(), now_ms});
    metrics_->SetJobProgress(m.job_id(), m.step(), st.train_loss(), st.samples_per_second());
  }
  if (m.values().count("eval_accuracy")) {
    st.set_eval_loss(m.values().count("eval_loss") ? m.values().at("eval_loss") : 0.0);
    st.set_eval_accuracy(m.values().at("eval_accuracy"));
    points.push_back({m.step(), "eval_loss", st.eval_loss(), now_ms});
    points.push_back({m.step(), "eval_accuracy", st.eval_accuracy(), now_ms});
    metrics_->SetJobEval(m.job_id(), st.eval_loss(), st.eval_accuracy());
  }
  if (points.empty()) return;
  UpdateProgress(job, "", std::move(points));
}

void JobManager::OnResult(const v1::StageResult& result) {
  auto it = jobs_.find(result.job_id());
  if (it == jobs_.end()) return;
  Job& job = it->second;
  job.finished_stages.insert(result.stage());
  std::vector<MetricPoint> points;
  const int64_t now_ms = NowMs();
  for (const auto& [key, value] : result.values()) {
    const std::string name = absl::StrCat("stage", result.stage(), ".", key);
    (*job.status.mutable_summary())[name] = value;
    points.push_back({job.status.step(), name, value, now_ms});
  }
  UpdateProgress(job, "", std::move(points));
  if (job.finished_stages.size() == job.workers.size()) {
    if (job.status.attempts_size() > 0) {
      v1::JobAttempt* a = job.status.mutable_attempts(job.status.attempts_size() - 1);
      a->set_ended_unix_ms(now_ms);
      a->set_reached_step(job.status.total_steps());
    }
    job.status.set_step(job.status.total_steps());
    EndJob(result.job_id(), v1::SUCCEEDED, "");
  }
}

void JobManager::OnPhaseDone(const v1::PhaseDone& d) {
  // Every stage finished phase p: record it and let them all start p + 1.
  auto it = jobs_.find(d.job_id());
  if (it == jobs_.end()) return;
  Job& job = it->second;
  std::set<int>& done = job.phase_done[d.phase()];
  done.insert(d.stage());
  if (done.size() < job.workers.size()) return;
  const std::vector<PhaseSpec> phases = Phases(job.spec);
  const int next = d.phase() + 1;
  if (next >= static_cast<int>(phases.size())) {
    EndJob(d.job_id(), v1::FAILED,
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
  for (const std::string& worker : job.workers) Send(worker, StartCommand(d.job_id(), next));
}

void JobManager::OnProfile(const v1::ProfileResult& result) {
  auto it = jobs_.find(result.job_id());
  if (it == jobs_.end() || it->second.planned) return;
  const std::string job_id = result.job_id();
  Job& job = it->second;
  auto planned = scheduler_.PlanFromProfile(job.spec, job.ranges, result, job.workers);
  if (!planned.ok()) {
    EndJob(job_id, v1::FAILED, std::string(planned.status().message()));
    return;
  }
  job.planned = true;
  job.ranges = std::move(planned->ranges);
  job.modes = std::move(planned->modes);
  auto& summary = *job.status.mutable_summary();
  for (const auto& [key, value] : planned->summary) summary[key] = value;
  summary["plan.profile_cached"] = result.cached() ? 1 : 0;
  UpdateProgress(job, "planned", {});
  // Transition writes the plan first, then the state.
  if (!Transition(job_id, v1::CONFIGURING, "").ok()) return;
  Configure(job_id, jobs_.at(job_id));
}

void JobManager::OnError(const v1::StageError& e) {
  auto it = jobs_.find(e.job_id());
  if (it == jobs_.end()) return;
  Job& job = it->second;
  const auto code = static_cast<absl::StatusCode>(e.code());
  if (code == absl::StatusCode::kDataLoss && job.resume && job.status.state() == v1::CONFIGURING) {
    // The shard it was told to load is damaged: never offer that checkpoint
    // again; the next attempt takes an older one.
    const std::string dir = job.resume->dir;
    if (absl::Status s = checkpoint::MarkCorrupt(dir, e.message()); !s.ok()) {
      STAGEWISE_LOG(ERROR) << "job " << e.job_id() << ": " << s;
    }
    Recover(e.job_id(),
            absl::StrCat("checkpoint ", dir, " is corrupt (skipped from now on): ", e.message()),
            "corrupt_checkpoint");
    return;
  }
  if (e.stage() >= 0 && Retryable(e)) {
    Recover(e.job_id(), e.message(), "stage_error");
    return;
  }
  EndJob(e.job_id(), v1::FAILED, e.message());
}

void JobManager::OnWorkerLost(const WorkerRegistry::Removed& worker, const std::string& why) {
  STAGEWISE_LOG(WARNING) << "lost worker " << worker.worker_id << ": " << why;
  if (worker.job_id.empty()) return;
  const std::string text =
      worker.stage >= 0
          ? absl::StrCat("lost worker ", worker.worker_id, " (stage ", worker.stage, "): ", why)
          : absl::StrCat("lost worker ", worker.worker_id, ": ", why);
  Recover(worker.job_id, text, "worker_lost");
}

void JobManager::OnCheckpointSaved(const v1::CheckpointSaved& saved) {
  auto it = jobs_.find(saved.job_id());
  if (it == jobs_.end() || it->second.spec.checkpoint.dir.empty()) return;
  Job& job = it->second;
  if (saved.stage() < 0 || saved.stage() >= static_cast<int>(job.workers.size())) return;
  // Uncommitted checkpoints are few (a stage lags its peers by a step or two):
  // keep the newest 16 so no sender can grow the map.
  while (job.shards.size() >= 16 && job.shards.count(saved.step()) == 0) {
    job.shards.erase(job.shards.begin());
  }
  std::map<int, v1::CheckpointSaved>& stages = job.shards[saved.step()];
  stages[saved.stage()] = saved;
  if (stages.size() == job.workers.size()) CommitCheckpoint(saved.job_id(), job, saved.step());
}

void JobManager::CommitCheckpoint(const std::string& job_id, Job& job, int64_t step) {
  const std::map<int, v1::CheckpointSaved> stages = std::move(job.shards[step]);
  job.shards.erase(job.shards.begin(), job.shards.upper_bound(step));
  const std::string& root = job.spec.checkpoint.dir;
  const std::string dir = checkpoint::StepDir(root, job_id, step);
  v1::CheckpointManifest m;
  m.set_format(checkpoint::kFormat);
  m.set_job_id(job_id);
  m.set_step(step);
  m.set_phase(stages.begin()->second.phase());
  m.set_phase_step(stages.begin()->second.phase_step());
  m.set_total_steps(job.status.total_steps());
  m.set_created_unix_ms(NowMs());
  m.set_attempt(job.attempt);
  m.set_job_spec_yaml(job.yaml);
  absl::Status problem;
  for (const auto& [stage, saved] : stages) {
    v1::CheckpointShard* shard = m.add_shards();
    shard->set_stage(stage);
    shard->set_file(checkpoint::ShardFileName(stage));
    shard->set_bytes(saved.bytes());
    shard->set_crc32(saved.crc32());
    shard->set_block_begin(job.ranges.at(stage).first);
    shard->set_block_end(job.ranges.at(stage).second);
    if (static_cast<size_t>(stage) < job.modes.size()) {
      for (const std::string& mode : job.modes[stage]) shard->add_block_modes(mode);
    }
    if (saved.phase() != m.phase() || saved.phase_step() != m.phase_step()) {
      problem = absl::InternalError(absl::StrCat("stage ", stage, " saved phase ", saved.phase(),
                                                 " step ", saved.phase_step(), ", stage 0 phase ",
                                                 m.phase(), " step ", m.phase_step()));
    }
    // The worker's path must be the coordinator's: the same volume, mounted
    // at the same place.
    const std::string here = dir + "/" + shard->file();
    std::error_code ec;
    const auto size = std::filesystem::file_size(here, ec);
    if (problem.ok() && (ec || static_cast<int64_t>(size) != saved.bytes())) {
      problem = absl::FailedPreconditionError(absl::StrCat(
          "stage ", stage, " wrote ", saved.path(), " (", saved.bytes(),
          " bytes) but the coordinator ",
          ec ? absl::StrCat("cannot see ", here) : absl::StrCat("sees ", size, " bytes at ", here),
          ": checkpoint.dir must be the same shared volume, at the same path, everywhere"));
    }
  }
  if (problem.ok()) problem = checkpoint::WriteManifest(dir, m);
  if (!problem.ok()) {
    STAGEWISE_LOG(ERROR) << "job " << job_id << ": checkpoint at step " << step
                         << " not committed: " << problem;
    UpdateProgress(
        job, absl::StrCat("checkpoint at step ", step, " NOT committed: ", problem.message()), {});
    return;
  }
  metrics_->CountCheckpoint();
  job.status.set_last_checkpoint_step(step);
  auto pruned = checkpoint::Prune(root, job_id, job.spec.checkpoint.keep);
  if (!pruned.ok()) STAGEWISE_LOG(WARNING) << "job " << job_id << ": " << pruned.status();
  UpdateProgress(job, absl::StrCat("checkpoint at step ", step, " committed"), {});
}

void JobManager::Recover(const std::string& job_id, const std::string& why,
                         const std::string& cause) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  const v1::JobState state = job.status.state();
  if (state == v1::PENDING || state == v1::RECOVERING) {
    // Not running (anymore): nothing to end. A lost worker names the cause
    // better than the broken streams its peers reported first.
    if (state == v1::RECOVERING && cause == "worker_lost" && job.status.attempts_size() > 0) {
      job.status.mutable_attempts(job.status.attempts_size() - 1)->set_end_reason(why);
      UpdateProgress(job, why, {});
    }
    return;
  }
  STAGEWISE_LOG(WARNING) << "job " << job_id << " attempt " << job.attempt << " ended: " << why;
  // End the attempt: its stages stop, its workers are free again.
  for (const std::string& worker : registry_.Release(job_id)) {
    v1::Command stop;
    stop.mutable_stop()->set_job_id(job_id);
    stop.mutable_stop()->set_reason(absl::StrCat("attempt ", job.attempt, " ended: ", why));
    Send(worker, std::move(stop));
  }
  job.workers.clear();
  job.pending_acks.clear();
  job.finished_stages.clear();
  job.phase_done.clear();
  job.shards.clear();
  job.configure_deadline = absl::InfiniteFuture();
  job.attempt_ended = absl::Now();
  job.max_step = std::max(job.max_step, job.status.step());
  if (state == v1::PROFILING) {
    // Only the profile was lost: back to the queue as it was.
    scheduler_.Enqueue({job_id, static_cast<int>(job.ranges.size()), job.needs_plan});
    (void)Transition(job_id, v1::PENDING, why);
    schedule_needed_ = true;
    return;
  }
  if (job.status.attempts_size() > 0) {
    v1::JobAttempt* a = job.status.mutable_attempts(job.status.attempts_size() - 1);
    if (a->ended_unix_ms() == 0) a->set_ended_unix_ms(NowMs());
    a->set_end_reason(why);
  }
  metrics_->CountRestart(cause);
  int ended = 0;
  for (const v1::JobAttempt& a : job.status.attempts()) ended += a.ended_unix_ms() > 0 ? 1 : 0;
  if (ended > job.spec.recovery.max_restarts) {
    EndJob(job_id, v1::FAILED,
           absl::StrCat("gave up after ", ended, " attempt(s) (recovery.max_restarts: ",
                        job.spec.recovery.max_restarts, "); the last one ended: ", why));
    return;
  }
  job.attempt++;
  job.status.set_attempt(job.attempt);
  UpdateProgress(job, "", {});  // the new attempt number is written with the transition
  if (!Transition(job_id, v1::RECOVERING, why).ok()) return;
  QueueRecovery(job_id, jobs_.at(job_id), why);
}

bool JobManager::QueueRecovery(const std::string& job_id, Job& job, const std::string& why) {
  job.resume.reset();
  if (!job.spec.checkpoint.dir.empty()) {
    std::vector<std::string> skipped;
    std::vector<checkpoint::Committed> committed =
        checkpoint::ListCommitted(job.spec.checkpoint.dir, job_id, false, &skipped);
    for (const std::string& line : skipped) {
      STAGEWISE_LOG(WARNING) << "job " << job_id << ": skipping checkpoint " << line;
    }
    for (checkpoint::Committed& c : committed) {
      if (c.manifest.shards_size() != static_cast<int>(job.ranges.size()) && !job.needs_plan) {
        STAGEWISE_LOG(WARNING) << "job " << job_id << ": skipping checkpoint " << c.dir << ": "
                               << c.manifest.shards_size() << " shards for " << job.ranges.size()
                               << " stages";
        continue;
      }
      job.resume = std::move(c);
      break;
    }
  }
  if (job.resume) {
    // The stages must be cut as in the checkpoint (a planned partition, too).
    job.ranges.clear();
    job.modes.clear();
    bool any_modes = false;
    for (const v1::CheckpointShard& shard : job.resume->manifest.shards()) {
      job.ranges.emplace_back(shard.block_begin(), shard.block_end());
      job.modes.emplace_back(shard.block_modes().begin(), shard.block_modes().end());
      any_modes = any_modes || shard.block_modes_size() > 0;
    }
    if (!any_modes) job.modes.clear();
    job.planned = true;
    UpdateProgress(
        job,
        absl::StrCat("attempt ", job.attempt, " will resume from the checkpoint at step ",
                     job.resume->manifest.step(), " (", job.resume->dir, ")"),
        {});
  } else if (!job.spec.recovery.from_scratch) {
    EndJob(job_id, v1::FAILED,
           absl::StrCat("no committed checkpoint to resume from and recovery.from_scratch is "
                        "false; the last attempt ended: ",
                        why));
    return false;
  } else {
    UpdateProgress(
        job,
        absl::StrCat("attempt ", job.attempt, " will start from step 0 (no committed checkpoint)"),
        {});
  }
  job.recovery_deadline = absl::Now() + absl::Seconds(job.spec.recovery.wait_seconds);
  scheduler_.Requeue({job_id, static_cast<int>(job.ranges.size()), job.needs_plan && !job.planned});
  schedule_needed_ = true;
  return true;
}

void JobManager::CheckDeadlines(absl::Time now) {
  std::vector<std::pair<std::string, bool>> due;  // (job, recovering)
  for (const auto& [id, job] : jobs_) {
    if (job.status.state() == v1::RECOVERING && now >= job.recovery_deadline) {
      due.emplace_back(id, true);
    } else if (job.status.state() == v1::CONFIGURING && now >= job.configure_deadline) {
      due.emplace_back(id, false);
    }
  }
  for (const auto& [id, recovering] : due) {
    Job& job = jobs_.at(id);
    if (recovering) {
      const std::string last =
          job.status.attempts_size() > 0
              ? job.status.attempts(job.status.attempts_size() - 1).end_reason()
              : job.status.reason();
      EndJob(id, v1::FAILED,
             absl::StrCat("no ", job.ranges.size(), " idle workers within recovery.wait_seconds (",
                          job.spec.recovery.wait_seconds, " s) after attempt ", job.attempt - 1,
                          " ended: ", last));
    } else {
      std::vector<std::string> silent;
      for (const auto& [command, worker] : job.pending_acks) silent.push_back(worker);
      Recover(id,
              absl::StrCat("the stages did not acknowledge their assignment within ",
                           absl::FormatDuration(options_.configure_timeout), " (no answer from ",
                           absl::StrJoin(silent, ", "), ")"),
              "configure_timeout");
    }
  }
}

// --- Loop thread: lifecycle -------------------------------------------------

void JobManager::ScheduleIfNeeded() {
  if (!schedule_needed_) return;
  schedule_needed_ = false;
  Schedule();
}

void JobManager::Schedule() {
  Scheduler::Round round = scheduler_.Schedule();
  for (const Scheduler::Waiting& w : round.waiting) {
    auto it = jobs_.find(w.job_id);
    if (it == jobs_.end() || it->second.status.reason() == w.reason) continue;
    it->second.status.set_reason(w.reason);
    UpdateProgress(it->second, w.reason, {});
  }
  for (const Scheduler::Placement& p : round.placed) {
    auto it = jobs_.find(p.job_id);
    if (it == jobs_.end()) {
      registry_.Release(p.job_id);
      continue;
    }
    it->second.workers = p.workers;
    auto moved = Transition(p.job_id, p.profile ? v1::PROFILING : v1::CONFIGURING, "");
    if (!moved.ok()) {
      EndJob(p.job_id, v1::FAILED,
             absl::StrCat("cannot record the placement: ", moved.status().message()));
      continue;
    }
    Job& job = jobs_.at(p.job_id);
    if (p.profile) {
      Send(p.workers.front(), Scheduler::ProfileCommand(p.job_id, job.yaml));
    } else {
      Configure(p.job_id, job);
    }
  }
}

void JobManager::Configure(const std::string& job_id, Job& job) {
  std::vector<v1::Command> commands =
      scheduler_.StageAssignments(job_id, job.yaml, job.workers, job.ranges, job.modes);
  job.recovery_deadline = absl::InfiniteFuture();
  job.configure_deadline = absl::Now() + options_.configure_timeout;
  // A new attempt: its record, and where it starts.
  v1::JobAttempt* a = job.status.add_attempts();
  a->set_attempt(job.attempt);
  a->set_started_unix_ms(NowMs());
  for (const std::string& w : job.workers) a->add_workers(w);
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
    for (size_t j = 0; j < commands.size(); ++j) {
      const v1::CheckpointShard& shard = m.shards(static_cast<int>(j));
      v1::ResumePoint* r = commands[j].mutable_configure()->mutable_resume();
      r->set_step(m.step());
      r->set_phase(m.phase());
      r->set_phase_step(m.phase_step());
      r->set_shard_path(job.resume->dir + "/" + shard.file());
      r->set_shard_bytes(shard.bytes());
      r->set_shard_crc32(shard.crc32());
    }
  } else if (job.attempt > 0) {
    job.status.set_steps_redone(job.status.steps_redone() + job.max_step);
    metrics_->AddStepsRedone(job.max_step);
    job.status.set_step(0);
    job.status.set_phase(0);
  }
  UpdateProgress(job, "", {});
  // A claimed worker whose control stream ended since it was claimed has left
  // the registry (its stage would get no next_address and fail as a bad
  // assignment, which would fail the job). The lost-worker task already
  // queued ends this attempt and recovers the job; send nothing meanwhile.
  for (size_t j = 0; j + 1 < commands.size(); ++j) {
    if (commands[j].configure().next_address().empty()) {
      STAGEWISE_LOG(WARNING) << "job " << job_id << " attempt " << job.attempt << ": worker "
                             << job.workers[j + 1] << " left before its stage was configured";
      return;
    }
  }
  for (size_t j = 0; j < commands.size(); ++j) {
    commands[j].mutable_configure()->set_attempt(job.attempt);
    commands[j].set_command_id(next_command_++);
    job.pending_acks.emplace(commands[j].command_id(), job.workers[j]);
    Send(job.workers[j], std::move(commands[j]));
  }
}

absl::StatusOr<v1::JobStatus> JobManager::Transition(const std::string& job_id, v1::JobState to,
                                                     const std::string& reason) {
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
  Publish(*st, reason);
  return st;
}

// By value: callers pass strings owned by the job (its map key, its status),
// which the erase below destroys (found by the coordinator fuzz target).
void JobManager::EndJob(std::string job_id, v1::JobState state, std::string reason) {
  if (!jobs_.count(job_id)) return;
  scheduler_.Remove(job_id);
  (void)Transition(job_id, state, reason);
  jobs_.erase(job_id);
  for (const std::string& worker : registry_.Release(job_id)) {
    if (state == v1::SUCCEEDED) continue;
    v1::Command stop;
    stop.mutable_stop()->set_job_id(job_id);
    stop.mutable_stop()->set_reason(reason);
    Send(worker, std::move(stop));
  }
  schedule_needed_ = true;
}

void JobManager::UpdateProgress(Job& job, const std::string& message,
                                std::vector<MetricPoint> points) {
  job.status.set_updated_unix_ms(NowMs());
  dirty_.insert(job.status.job_id());
  for (MetricPoint& p : points) points_.emplace_back(job.status.job_id(), std::move(p));
  if (flush_due_ == absl::InfiniteFuture()) {
    flush_due_ = absl::Now() + options_.progress_flush_interval;
  }
  Publish(job.status, message);
}

void JobManager::FlushProgress() {
  flush_due_ = absl::InfiniteFuture();
  if (dirty_.empty() && points_.empty()) return;
  JobStore::ProgressBatch batch;
  for (const std::string& id : dirty_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end()) batch.statuses.push_back(it->second.status);
  }
  batch.points = std::move(points_);
  dirty_.clear();
  points_.clear();
  if (absl::Status s = store_->WriteProgress(batch); !s.ok()) {
    STAGEWISE_LOG(ERROR) << "progress of " << batch.statuses.size() << " job(s), "
                         << batch.points.size() << " metric point(s) not saved: " << s;
  }
}

void JobManager::Send(const std::string& worker_id, v1::Command command) {
  if (command.command_id() == 0) command.set_command_id(next_command_++);
  registry_.Send(worker_id, command);
}

void JobManager::RefreshGauges() {
  const WorkerRegistry::Counts workers = registry_.GetCounts();
  metrics_->SetWorkers(workers.idle, workers.busy);
  std::map<std::string, int64_t> counts = {{"PENDING", 0}, {"CONFIGURING", 0}, {"RUNNING", 0}};
  for (const auto& [id, job] : jobs_) counts[v1::JobState_Name(job.status.state())]++;
  for (const auto& [state, n] : counts) metrics_->SetJobsInState(state, n);
}

}  // namespace stagewise::coordinator
