#include "coordinator/job_manager.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "services/common/log.h"
#include "services/common/status_macros.h"
#include "services/data/sizes.h"
#include "services/models/plan.h"

namespace stagewise::coordinator {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

v1::Command StartCommand(const std::string& job_id, int phase) {
  v1::Command start;
  start.mutable_start()->set_job_id(job_id);
  start.mutable_start()->set_phase(phase);
  return start;
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
    if (rec.status.state() == v1::PENDING) {
      auto spec = ParseJobSpec(rec.spec_yaml);
      auto blocks = spec.ok() ? models::PlanModel(spec->model)
                              : absl::StatusOr<std::vector<models::BlockInfo>>(spec.status());
      auto ranges = blocks.ok()
                        ? models::ResolvePartition(spec->stages, static_cast<int>(blocks->size()))
                        : absl::StatusOr<std::vector<std::pair<int, int>>>(blocks.status());
      if (ranges.ok()) {
        Job job = NewJob(rec.status, *spec, rec.spec_yaml, *blocks, *ranges);
        scheduler_.Enqueue({id, static_cast<int>(job.ranges.size()), job.needs_plan});
        jobs_.emplace(id, std::move(job));
        Publish(rec.status, "");
        continue;
      }
      (void)Transition(id, v1::FAILED, std::string(ranges.status().message()));
      continue;
    }
    // Recovery from checkpoints arrives with a later version; until then a job
    // interrupted by a coordinator restart ends here, with the reason kept.
    (void)Transition(id, v1::FAILED,
                     absl::StrCat("the coordinator restarted while the job was ",
                                  v1::JobState_Name(rec.status.state())));
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
  return deadline;
}

void JobManager::Housekeeping(absl::Time now) {
  for (const WorkerRegistry::Removed& lost : registry_.Expire(now, options_.heartbeat_timeout)) {
    OnWorkerLost(
        lost, absl::StrCat("no heartbeat for ", absl::FormatDuration(options_.heartbeat_timeout)));
  }
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
  job.needs_plan = spec.stages.partition == "auto" ||
                   (reversible && spec.stages.modes == "auto" && spec.stages.memory_budget > 0);
  if (!job.needs_plan && reversible && spec.stages.modes != "auto") {
    for (const auto& [b, e] : ranges) {
      std::vector<std::string> modes;
      for (int i = b; i < e; ++i) {
        modes.push_back(blocks[i].reversible ? spec.stages.modes : "store");
      }
      job.modes.push_back(std::move(modes));
    }
  }
  return job;
}

absl::StatusOr<std::string> JobManager::Submit(const std::string& yaml) {
  STAGEWISE_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(yaml));
  // ParseJobSpec accepts only the algorithms of the schema table
  // (services/common/job_spec.cc), which is also what workers construct.
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<models::BlockInfo> blocks, models::PlanModel(spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(
      auto ranges, models::ResolvePartition(spec.stages, static_cast<int>(blocks.size())));
  const int64_t per_epoch = data::NominalTrainSize(spec.data) / spec.batch_size;
  if (per_epoch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec.batch_size, " is larger than the training set"));
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
  st.set_state(v1::PENDING);
  st.set_algorithm(spec.algorithm.name);
  const std::vector<PhaseSpec> phases = Phases(spec);
  st.set_num_phases(static_cast<int>(phases.size()));
  st.set_phase(0);
  st.set_phase_name(phases.front().name);
  st.set_num_stages(static_cast<int>(ranges.size()));
  st.set_total_steps(data::TotalSteps(spec, per_epoch));
  st.set_created_unix_ms(NowMs());
  st.set_updated_unix_ms(st.created_unix_ms());
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
  const std::string why = reason.empty() ? "cancelled by the user" : reason;
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

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::Register(const v1::WorkerInfo& info) {
  std::optional<WorkerRegistry::Removed> replaced;
  STAGEWISE_ASSIGN_OR_RETURN(std::string id, registry_.Register(info, absl::Now(), &replaced));
  if (replaced.has_value()) {
    Post([this, lost = *replaced] { OnWorkerLost(lost, "it registered again (restarted?)"); });
  }
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(id);
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return resp;
}

absl::Status JobManager::Connect(const std::string& worker_id, CommandSink* sink) {
  STAGEWISE_RETURN_IF_ERROR(registry_.Connect(worker_id, sink, absl::Now()));
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
  if (!registry_.Touch(event.worker_id(), absl::Now())) return;
  switch (event.event_case()) {
    case v1::WorkerEvent::kAck:
    case v1::WorkerEvent::kMetrics:
    case v1::WorkerEvent::kResult:
    case v1::WorkerEvent::kPhaseDone:
    case v1::WorkerEvent::kProfile:
    case v1::WorkerEvent::kError:
      Post([this, event] { HandleEvent(event); });
      return;
    default:
      return;  // a heartbeat: Touch was all of it
  }
}

// --- Loop thread: events ----------------------------------------------------

void JobManager::HandleEvent(const v1::WorkerEvent& event) {
  switch (event.event_case()) {
    case v1::WorkerEvent::kAck:
      return OnAck(event.ack());
    case v1::WorkerEvent::kMetrics:
      return OnMetrics(event.metrics());
    case v1::WorkerEvent::kResult:
      return OnResult(event.result());
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

void JobManager::OnAck(const v1::Ack& ack) {
  for (auto& [id, job] : jobs_) {
    if (job.pending_acks.erase(ack.command_id()) == 0) continue;
    if (!job.pending_acks.empty() || job.status.state() != v1::CONFIGURING) return;
    const std::string job_id = id;  // `id` dies if the transition ends the job
    if (!Transition(job_id, v1::RUNNING, "").ok()) return;
    Job& running = jobs_.at(job_id);
    running.started = absl::Now();
    for (const std::string& worker : running.workers) Send(worker, StartCommand(job_id, 0));
    return;
  }
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
    const int64_t per_epoch = data::NominalTrainSize(job.spec.data) / job.spec.batch_size;
    st.set_epoch(static_cast<int>(m.step() / std::max<int64_t>(1, per_epoch)));
    st.set_train_loss(m.values().at("train_loss"));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - job.started);
    if (seconds > 0) {
      st.set_samples_per_second(static_cast<double>(m.step() * job.spec.batch_size) / seconds);
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
  job.status.set_algorithm(phases[next].algorithm.name);
  UpdateProgress(job,
                 absl::StrCat("phase ", next + 1, "/", phases.size(), " (", phases[next].name, ", ",
                              phases[next].algorithm.name, ") started"),
                 {});
  FlushProgress();  // the new phase is on disk before the stages start it
  for (const std::string& worker : job.workers) Send(worker, StartCommand(d.job_id(), next));
}

void JobManager::OnProfile(const v1::ProfileResult& result) {
  auto it = jobs_.find(result.job_id());
  if (it == jobs_.end() || it->second.planned) return;
  const std::string job_id = result.job_id();
  Job& job = it->second;
  auto planned = scheduler_.PlanFromProfile(job.spec, result, job.workers);
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
  if (jobs_.count(e.job_id())) EndJob(e.job_id(), v1::FAILED, e.message());
}

void JobManager::OnWorkerLost(const WorkerRegistry::Removed& worker, const std::string& why) {
  STAGEWISE_LOG(WARNING) << "lost worker " << worker.worker_id << ": " << why;
  if (!worker.job_id.empty()) {
    EndJob(worker.job_id, v1::FAILED,
           absl::StrCat("lost worker ", worker.worker_id, " (stage ", worker.stage, "): ", why));
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
  for (size_t j = 0; j < commands.size(); ++j) {
    commands[j].set_command_id(next_command_++);
    job.pending_acks.insert(commands[j].command_id());
    Send(job.workers[j], std::move(commands[j]));
  }
}

absl::StatusOr<v1::JobStatus> JobManager::Transition(const std::string& job_id, v1::JobState to,
                                                     const std::string& reason) {
  FlushProgress();  // what happened before the transition is on disk before it
  absl::StatusOr<v1::JobStatus> st = store_->Transition(job_id, to, reason);
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

void JobManager::EndJob(const std::string& job_id, v1::JobState state, const std::string& reason) {
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
