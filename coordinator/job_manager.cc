#include "coordinator/job_manager.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "services/planner/planner.h"
#include "services/data/sizes.h"
#include "services/models/plan.h"

namespace stagewise::coordinator {
namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

JobManager::JobManager(JobStore* store, metrics::CoordinatorMetrics* metrics,
                       JobManagerOptions options)
    : store_(store), metrics_(metrics), options_(options) {}

JobManager::~JobManager() { Stop(); }

absl::Status JobManager::Start() {
  auto unfinished = store_->UnfinishedJobs();
  if (!unfinished.ok()) return unfinished.status();
  absl::MutexLock lock(&mu_);
  for (const JobRecord& rec : *unfinished) {
    const std::string& id = rec.status.job_id();
    statuses_[id] = rec.status;
    if (rec.status.state() == v1::PENDING) {
      auto spec = ParseJobSpec(rec.spec_yaml);
      auto plan = spec.ok() ? models::PlanModel(spec->model)
                            : absl::StatusOr<std::vector<models::BlockInfo>>(spec.status());
      auto ranges = plan.ok()
                        ? models::ResolvePartition(spec->stages, static_cast<int>(plan->size()))
                        : absl::StatusOr<std::vector<std::pair<int, int>>>(plan.status());
      if (ranges.ok()) {
        active_[id] = NewActiveJob(*spec, rec.spec_yaml, *plan, *ranges);
        pending_.push_back(id);
        continue;
      }
      TransitionLocked(id, v1::FAILED, std::string(ranges.status().message()));
      continue;
    }
    // Recovery from checkpoints arrives with a later version; until then a job
    // interrupted by a coordinator restart ends here, with the reason kept.
    TransitionLocked(id, v1::FAILED,
                     absl::StrCat("the coordinator restarted while the job was ",
                                  v1::JobState_Name(rec.status.state())));
  }
  housekeeping_ = std::thread([this] { Housekeeping(); });
  return absl::OkStatus();
}

void JobManager::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (housekeeping_.joinable()) housekeeping_.join();
}

void JobManager::Housekeeping() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.housekeeping)) return;
      const absl::Time now = absl::Now();
      std::vector<std::string> lost;
      for (const auto& [id, w] : workers_) {
        if (now - w.last_seen > options_.heartbeat_timeout) lost.push_back(id);
      }
      for (const std::string& id : lost) {
        CommandSink* sink = workers_[id].sink;
        WorkerLostLocked(id, absl::StrCat("no heartbeat for ",
                                          absl::FormatDuration(options_.heartbeat_timeout)));
        if (sink != nullptr) sink->Close(absl::UnavailableError("missed heartbeats"));
      }
      RefreshGaugesLocked();
    }
  }
}

JobManager::ActiveJob JobManager::NewActiveJob(const JobSpec& spec, const std::string& yaml,
                                               const std::vector<models::BlockInfo>& blocks,
                                               const std::vector<std::pair<int, int>>& ranges) {
  ActiveJob job;
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
      for (int i = b; i < e; ++i)
        modes.push_back(blocks[i].reversible ? spec.stages.modes : "store");
      job.modes.push_back(std::move(modes));
    }
  }
  return job;
}

absl::StatusOr<std::string> JobManager::Submit(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  if (!spec.ok()) return spec.status();
  // ParseJobSpec accepts only the algorithms of the schema table
  // (services/common/job_spec.cc), which is also what workers construct.
  auto plan = models::PlanModel(spec->model);
  if (!plan.ok()) return plan.status();
  auto ranges = models::ResolvePartition(spec->stages, static_cast<int>(plan->size()));
  if (!ranges.ok()) return ranges.status();
  const int64_t per_epoch = data::NominalTrainSize(spec->data) / spec->batch_size;
  if (per_epoch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec->batch_size, " is larger than the training set"));
  }
  JobRecord record;
  record.spec_yaml = yaml;
  v1::JobStatus& st = record.status;
  st.set_job_id(store_->NewJobId());
  st.set_name(spec->name);
  st.set_state(v1::PENDING);
  st.set_algorithm(spec->algorithm.name);
  {
    const std::vector<PhaseSpec> phases = Phases(*spec);
    st.set_num_phases(static_cast<int>(phases.size()));
    st.set_phase(0);
    st.set_phase_name(phases.front().name);
  }
  st.set_num_stages(static_cast<int>(ranges->size()));
  st.set_total_steps(data::TotalSteps(*spec, per_epoch));
  st.set_created_unix_ms(NowMs());
  st.set_updated_unix_ms(st.created_unix_ms());
  if (absl::Status s = store_->CreateJob(record); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  active_[st.job_id()] = NewActiveJob(*spec, yaml, *plan, *ranges);
  statuses_[st.job_id()] = st;
  pending_.push_back(st.job_id());
  metrics_->CountTransition("PENDING");
  ScheduleLocked();
  return st.job_id();
}

absl::StatusOr<v1::JobStatus> JobManager::GetJob(const std::string& job_id) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = statuses_.find(job_id);
    if (it != statuses_.end()) return it->second;
  }
  auto rec = store_->GetJob(job_id);
  if (!rec.ok()) return rec.status();
  return rec->status;
}

absl::StatusOr<std::vector<v1::JobStatus>> JobManager::ListJobs(int limit) const {
  return store_->ListJobs(limit);
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& job_id,
                                                 const std::string& reason) {
  const std::string why = reason.empty() ? "cancelled by the user" : reason;
  absl::MutexLock lock(&mu_);
  auto it = statuses_.find(job_id);
  if (it == statuses_.end()) {
    auto rec = store_->GetJob(job_id);  // finished (or unknown: NOT_FOUND)
    if (!rec.ok()) return rec.status();
    return rec->status;
  }
  if (it->second.state() == v1::PENDING) {
    pending_.erase(std::remove(pending_.begin(), pending_.end(), job_id), pending_.end());
    active_.erase(job_id);
    TransitionLocked(job_id, v1::CANCELLED, why);
  } else {
    EndJobLocked(job_id, v1::CANCELLED, why);
  }
  auto rec = store_->GetJob(job_id);
  if (!rec.ok()) return rec.status();
  return rec->status;
}

std::vector<v1::WorkerInfo> JobManager::ListWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_) {
    v1::WorkerInfo info = w.info;
    (*info.mutable_labels())["state"] =
        w.sink == nullptr ? "registering" : (w.job_id.empty() ? "idle" : "busy");
    if (!w.job_id.empty()) {
      (*info.mutable_labels())["job"] = w.job_id;
      (*info.mutable_labels())["stage"] = std::to_string(w.stage);
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<int64_t> JobManager::Subscribe(const std::string& job_id, Listener listener) {
  auto current = GetJob(job_id);
  if (!current.ok()) return current.status();
  absl::MutexLock lock(&mu_);
  auto it = statuses_.find(job_id);
  v1::JobEvent first;
  *first.mutable_status() = it != statuses_.end() ? it->second : *current;
  listener(first);
  const int64_t id = next_subscription_++;
  listeners_[id] = {job_id, std::move(listener)};
  return id;
}

void JobManager::Unsubscribe(int64_t subscription) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(subscription);
}

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::Register(const v1::WorkerInfo& info) {
  if (info.address().empty()) {
    return absl::InvalidArgumentError("WorkerInfo.address: empty");
  }
  absl::MutexLock lock(&mu_);
  std::string id = info.worker_id().empty() ? info.address() : info.worker_id();
  if (workers_.count(id)) {
    // The same worker came back (restart): its old stream and job are gone.
    CommandSink* old = workers_[id].sink;
    WorkerLostLocked(id, "it registered again (restarted?)");
    if (old != nullptr) old->Close(absl::AbortedError("replaced by a new registration"));
  }
  Worker& w = workers_[id];
  w.info = info;
  w.info.set_worker_id(id);
  w.last_seen = absl::Now();
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(id);
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return resp;
}

absl::Status JobManager::Connect(const std::string& worker_id, CommandSink* sink) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("WorkerEvent.worker_id: '", worker_id, "' is not registered"));
  }
  it->second.sink = sink;
  it->second.last_seen = absl::Now();
  ScheduleLocked();
  RefreshGaugesLocked();
  return absl::OkStatus();
}

void JobManager::Disconnect(const std::string& worker_id, CommandSink* sink,
                            const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.sink != sink) return;
  WorkerLostLocked(worker_id, absl::StrCat("its control stream closed (", why.message(), ")"));
}

void JobManager::WorkerLostLocked(const std::string& worker_id, const std::string& why) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  const std::string job = it->second.job_id;
  const int stage = it->second.stage;
  workers_.erase(it);
  std::cerr << "coordinator: lost worker " << worker_id << ": " << why << "\n";
  if (!job.empty()) {
    EndJobLocked(job, v1::FAILED,
                 absl::StrCat("lost worker ", worker_id, " (stage ", stage, "): ", why));
  }
  RefreshGaugesLocked();
}

void JobManager::OnEvent(const v1::WorkerEvent& event) {
  absl::MutexLock lock(&mu_);
  auto wit = workers_.find(event.worker_id());
  if (wit == workers_.end()) return;
  wit->second.last_seen = absl::Now();
  switch (event.event_case()) {
    case v1::WorkerEvent::kAck: {
      for (auto& [id, job] : active_) {
        if (job.pending_acks.erase(event.ack().command_id()) == 0) continue;
        if (job.pending_acks.empty() && statuses_[id].state() == v1::CONFIGURING) {
          if (!TransitionLocked(id, v1::RUNNING, "")) break;
          job.started = absl::Now();
          job.last_step_time = job.started;
          for (size_t j = 0; j < job.workers.size(); ++j) {
            v1::Command start;
            start.mutable_start()->set_job_id(id);
            SendLocked(job.workers[j], std::move(start));
          }
        }
        break;
      }
      return;
    }
    case v1::WorkerEvent::kMetrics: {
      const v1::MetricsReport& m = event.metrics();
      auto jit = active_.find(m.job_id());
      if (jit == active_.end()) return;
      ActiveJob& job = jit->second;
      v1::JobStatus st = statuses_[m.job_id()];
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
        st.set_eval_loss(m.values().at("eval_loss"));
        st.set_eval_accuracy(m.values().at("eval_accuracy"));
        points.push_back({m.step(), "eval_loss", st.eval_loss(), now_ms});
        points.push_back({m.step(), "eval_accuracy", st.eval_accuracy(), now_ms});
        metrics_->SetJobEval(m.job_id(), st.eval_loss(), st.eval_accuracy());
      }
      if (points.empty()) return;
      if (absl::Status s = store_->AppendMetrics(m.job_id(), points); !s.ok()) {
        std::cerr << "coordinator: " << s << "\n";
      }
      UpdateStatusLocked(st, "");
      return;
    }
    case v1::WorkerEvent::kResult: {
      auto jit = active_.find(event.result().job_id());
      if (jit == active_.end()) return;
      jit->second.finished_stages.insert(event.result().stage());
      v1::JobStatus st = statuses_[event.result().job_id()];
      std::vector<MetricPoint> points;
      for (const auto& [key, value] : event.result().values()) {
        const std::string name = absl::StrCat("stage", event.result().stage(), ".", key);
        (*st.mutable_summary())[name] = value;
        points.push_back({st.step(), name, value, NowMs()});
      }
      (void)store_->AppendMetrics(st.job_id(), points);
      UpdateStatusLocked(st, "");
      if (jit->second.finished_stages.size() == jit->second.workers.size()) {
        EndJobLocked(event.result().job_id(), v1::SUCCEEDED, "");
      }
      return;
    }
    case v1::WorkerEvent::kPhaseDone: {
      // Every stage finished phase p: record it and let them all start p + 1.
      const v1::PhaseDone& d = event.phase_done();
      auto jit = active_.find(d.job_id());
      if (jit == active_.end()) return;
      ActiveJob& job = jit->second;
      std::set<int>& done = job.phase_done[d.phase()];
      done.insert(d.stage());
      if (done.size() < job.workers.size()) return;
      const std::vector<PhaseSpec> phases = Phases(job.spec);
      const int next = d.phase() + 1;
      if (next >= static_cast<int>(phases.size())) {
        EndJobLocked(d.job_id(), v1::FAILED,
                     absl::StrCat("stages reported the end of phase ", d.phase(),
                                  " but the job has only ", phases.size(), " phase(s)"));
        return;
      }
      v1::JobStatus st = statuses_[d.job_id()];
      st.set_phase(next);
      st.set_phase_name(phases[next].name);
      st.set_algorithm(phases[next].algorithm.name);
      UpdateStatusLocked(
          st, absl::StrCat("phase ", next + 1, "/", phases.size(), " (", phases[next].name, ", ",
                           phases[next].algorithm.name, ") started"));
      for (const std::string& worker : job.workers) {
        v1::Command start;
        start.mutable_start()->set_job_id(d.job_id());
        start.mutable_start()->set_phase(next);
        SendLocked(worker, std::move(start));
      }
      return;
    }
    case v1::WorkerEvent::kProfile:
      OnProfileLocked(event.profile());
      return;
    case v1::WorkerEvent::kError: {
      const v1::StageError& e = event.error();
      if (active_.count(e.job_id())) EndJobLocked(e.job_id(), v1::FAILED, e.message());
      return;
    }
    default:
      return;  // heartbeat
  }
}

void JobManager::ScheduleLocked() {
  std::vector<std::string> still_pending;
  for (const std::string& id : pending_) {
    ActiveJob& job = active_[id];
    const size_t need = job.ranges.size();
    std::vector<std::string> idle;
    for (const auto& [wid, w] : workers_) {
      if (w.sink != nullptr && w.job_id.empty()) idle.push_back(wid);
    }
    if (idle.size() < need || stopping_) {
      const std::string reason = absl::StrCat("waiting for ", need, " idle workers (", idle.size(),
                                              " idle, ", workers_.size(), " registered)");
      v1::JobStatus st = statuses_[id];
      if (st.reason() != reason) {
        st.set_reason(reason);
        UpdateStatusLocked(st, reason);
      }
      still_pending.push_back(id);
      continue;
    }
    idle.resize(need);
    const bool profile = job.needs_plan && !job.planned;
    if (!TransitionLocked(id, profile ? v1::PROFILING : v1::CONFIGURING, "")) continue;
    job.workers = idle;
    for (size_t j = 0; j < need; ++j) {
      workers_[idle[j]].job_id = id;
      workers_[idle[j]].stage = static_cast<int>(j);
    }
    if (profile) {
      // One worker profiles (workers of a job share a device type); the plan
      // follows when its ProfileResult arrives.
      v1::Command c;
      c.mutable_profile()->set_job_id(id);
      c.mutable_profile()->set_job_spec_yaml(job.yaml);
      SendLocked(idle[0], std::move(c));
      continue;
    }
    ConfigureLocked(id);
  }
  pending_ = std::move(still_pending);
  RefreshGaugesLocked();
}

void JobManager::ConfigureLocked(const std::string& id) {
  ActiveJob& job = active_[id];
  const size_t need = job.workers.size();
  for (size_t j = 0; j < need; ++j) {
    v1::Command c;
    v1::StageAssignment* a = c.mutable_configure();
    a->set_job_id(id);
    a->set_stage(static_cast<int>(j));
    a->set_num_stages(static_cast<int>(need));
    a->set_block_begin(job.ranges[j].first);
    a->set_block_end(job.ranges[j].second);
    if (j + 1 < need) a->set_next_address(workers_[job.workers[j + 1]].info.address());
    a->set_job_spec_yaml(job.yaml);
    if (j < job.modes.size()) {
      for (const std::string& m : job.modes[j]) a->add_block_modes(m);
    }
    c.set_command_id(next_command_++);
    job.pending_acks.insert(c.command_id());
    SendLocked(job.workers[j], std::move(c));
  }
}

void JobManager::OnProfileLocked(const v1::ProfileResult& result) {
  auto jit = active_.find(result.job_id());
  if (jit == active_.end() || jit->second.planned) return;
  ActiveJob& job = jit->second;
  auto profile = planner::ParseProfile(result.profile());
  if (!profile.ok()) {
    EndJobLocked(result.job_id(), v1::FAILED,
                 absl::StrCat("profile from the worker: ", profile.status().message()));
    return;
  }
  planner::PlanOptions options =
      planner::PlanOptionsForJob(job.spec, static_cast<int>(profile->blocks.size()));
  if (options.memory_caps.empty()) {
    // The workers' own --memory-bytes, where every one of them says.
    std::vector<int64_t> caps;
    for (const std::string& w : job.workers) caps.push_back(workers_[w].info.memory_bytes());
    if (std::all_of(caps.begin(), caps.end(), [](int64_t c) { return c > 0; })) {
      options.memory_caps = caps;
    }
  }
  auto plan = planner::MakePlan(*profile, options);
  if (!plan.ok()) {
    EndJobLocked(result.job_id(), v1::FAILED, absl::StrCat("plan: ", plan.status().message()));
    return;
  }
  job.planned = true;
  job.ranges.clear();
  job.modes.clear();
  v1::JobStatus st = statuses_[result.job_id()];
  auto& summary = *st.mutable_summary();
  for (size_t j = 0; j < plan->stages.size(); ++j) {
    const planner::StagePlan& s = plan->stages[j];
    job.ranges.emplace_back(s.begin, s.end);
    std::vector<std::string> modes;
    for (int i = s.begin; i < s.end; ++i)
      modes.push_back(s.store[i - s.begin] ? "store" : "rebuild");
    job.modes.push_back(std::move(modes));
    const std::string stage = absl::StrCat("plan.stage", j, ".");
    summary[stage + "block_begin"] = s.begin;
    summary[stage + "block_end"] = s.end;
    summary[stage + "peak_bytes"] = static_cast<double>(s.estimate.peak_bytes);
    summary[stage + "seconds_per_batch"] = s.estimate.time_s() + s.estimate.aux_head_s;
    int rebuilt = 0;
    for (int i = s.begin; i < s.end; ++i) rebuilt += s.store[i - s.begin] ? 0 : 1;
    summary[stage + "rebuild_blocks"] = rebuilt;
  }
  for (const planner::Prediction& p : plan->predictions) {
    // "nwise n=1" -> plan.predicted.nwise_n1 (summary keys carry no spaces).
    summary[absl::StrCat("plan.predicted.",
                         absl::StrReplaceAll(p.algorithm, {{" ", "_"}, {"=", ""}}))] =
        p.seconds_per_batch;
  }
  summary["plan.profile_cached"] = result.cached() ? 1 : 0;
  UpdateStatusLocked(st, "planned");
  if (!TransitionLocked(result.job_id(), v1::CONFIGURING, "")) return;
  ConfigureLocked(result.job_id());
}

void JobManager::SendLocked(const std::string& worker_id, v1::Command command) {
  if (command.command_id() == 0) command.set_command_id(next_command_++);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.sink == nullptr) return;
  it->second.sink->Send(command);
}

void JobManager::EndJobLocked(const std::string& job_id, v1::JobState state,
                              const std::string& reason) {
  auto jit = active_.find(job_id);
  if (jit == active_.end()) return;
  ActiveJob job = std::move(jit->second);
  active_.erase(jit);
  pending_.erase(std::remove(pending_.begin(), pending_.end(), job_id), pending_.end());
  TransitionLocked(job_id, state, reason);
  for (const std::string& wid : job.workers) {
    auto w = workers_.find(wid);
    if (w == workers_.end() || w->second.job_id != job_id) continue;
    if (state != v1::SUCCEEDED) {
      v1::Command stop;
      stop.mutable_stop()->set_job_id(job_id);
      stop.mutable_stop()->set_reason(reason);
      SendLocked(wid, std::move(stop));
    }
    w->second.job_id.clear();
    w->second.stage = -1;
  }
  ScheduleLocked();
}

bool JobManager::TransitionLocked(const std::string& job_id, v1::JobState to,
                                  const std::string& reason) {
  auto st = store_->Transition(job_id, to, reason);
  if (!st.ok()) {
    std::cerr << "coordinator: job " << job_id << ": " << st.status() << "\n";
    return false;
  }
  if (auto it = statuses_.find(job_id); it != statuses_.end()) {
    // Keep progress the store may not have seen yet.
    v1::JobStatus merged = it->second;
    merged.set_state(st->state());
    merged.set_reason(st->reason());
    merged.set_updated_unix_ms(st->updated_unix_ms());
    *st = merged;
  }
  metrics_->CountTransition(v1::JobState_Name(to));
  if (IsTerminal(to)) {
    statuses_.erase(job_id);
  } else {
    statuses_[job_id] = *st;
  }
  (void)store_->UpdateStatus(*st);
  NotifyLocked(*st, reason);
  return true;
}

void JobManager::UpdateStatusLocked(const v1::JobStatus& status, const std::string& message) {
  v1::JobStatus st = status;
  st.set_updated_unix_ms(NowMs());
  statuses_[st.job_id()] = st;
  if (absl::Status s = store_->UpdateStatus(st); !s.ok()) {
    std::cerr << "coordinator: job " << st.job_id() << ": " << s << "\n";
  }
  NotifyLocked(st, message);
}

void JobManager::NotifyLocked(const v1::JobStatus& status, const std::string& message) {
  v1::JobEvent event;
  *event.mutable_status() = status;
  event.set_message(message);
  for (auto& [id, entry] : listeners_) {
    if (entry.first == status.job_id()) entry.second(event);
  }
}

void JobManager::RefreshGaugesLocked() {
  int64_t idle = 0, busy = 0;
  for (const auto& [id, w] : workers_) (w.job_id.empty() ? idle : busy)++;
  metrics_->SetWorkers(idle, busy);
  std::map<std::string, int64_t> counts = {{"PENDING", 0}, {"CONFIGURING", 0}, {"RUNNING", 0}};
  for (const auto& [id, st] : statuses_) counts[v1::JobState_Name(st.state())]++;
  for (const auto& [state, n] : counts) metrics_->SetJobsInState(state, n);
}

}  // namespace stagewise::coordinator
