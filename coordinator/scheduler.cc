#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "services/planner/plan_proto.h"
#include "services/planner/planner.h"
#include "services/planner/profile.h"

namespace stagewise::coordinator {
namespace {

// "host:port" or "[v6]:port" -> the host, as gloo binds to it.
std::string HostOf(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

void Scheduler::Enqueue(Request request) {
  request.seq = next_seq_++;
  queue_.push_back(std::move(request));
}

void Scheduler::Requeue(Request request) {
  Remove(request.job_id);
  request.seq = next_seq_++;
  // After the recovering jobs already queued, before everything else.
  auto it = queue_.begin();
  while (it != queue_.end() && it->recovering) ++it;
  request.recovering = true;
  queue_.insert(it, std::move(request));
}

bool Scheduler::Remove(const std::string& job_id) {
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Request& r) { return r.job_id == job_id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

bool Scheduler::SetRank(const std::string& job_id, int rank) {
  for (Request& r : queue_) {
    if (r.job_id != job_id) continue;
    r.rank = rank;
    return true;
  }
  return false;
}

bool Scheduler::Queued(const std::string& job_id) const {
  return std::any_of(queue_.begin(), queue_.end(),
                     [&](const Request& r) { return r.job_id == job_id; });
}

std::vector<size_t> Scheduler::Order(absl::Time now) const {
  std::vector<size_t> order(queue_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (config_ == nullptr || usage_ == nullptr) return order;  // queue order
  // Per owner, dominant-resource style: its larger share of the pool's
  // workers and of its GPU workers (when there are any), in decayed
  // worker-seconds and then in workers held, per unit of weight.
  const WorkerRegistry::Counts pool = registry_->GetCounts();
  const double all = std::max(1, pool.registered);
  const double gpu = std::max(1, pool.gpu);
  std::map<std::string, std::pair<double, double>> share;
  for (const Request& r : queue_) {
    if (share.count(r.owner)) continue;
    const double weight = config_->OwnerOf(r.owner).weight;
    double used = usage_->DecayedWorkerSeconds(r.owner, now) / all;
    double held = usage_->HeldWorkers(r.owner) / all;
    if (pool.gpu > 0) {
      used = std::max(used, usage_->DecayedGpuWorkerSeconds(r.owner, now) / gpu);
      held = std::max(held, usage_->HeldGpuWorkers(r.owner) / gpu);
    }
    share[r.owner] = {used / weight, held / weight};
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Request& x = queue_[a];
    const Request& y = queue_[b];
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.recovering != y.recovering) return x.recovering;
    if (x.owner != y.owner && share[x.owner] != share[y.owner]) {
      return share[x.owner] < share[y.owner];
    }
    return x.seq < y.seq;
  });
  return order;
}

int Scheduler::Held(const std::string& owner) const {
  auto it = pass_held_.find(owner);
  return usage_->HeldWorkers(owner) + (it == pass_held_.end() ? 0 : it->second.first);
}

int Scheduler::HeldJobs(const std::string& owner) const {
  auto it = pass_held_.find(owner);
  return usage_->HeldJobs(owner) + (it == pass_held_.end() ? 0 : it->second.second);
}

std::string Scheduler::QuotaBlock(const Request& request) const {
  if (config_ == nullptr || usage_ == nullptr) return "";
  const SharingConfig::Owner& quota = config_->OwnerOf(request.owner);
  if (quota.max_running_jobs > 0 && HeldJobs(request.owner) >= quota.max_running_jobs) {
    return absl::StrCat("quota: ", OwnerKey(request.owner), " runs ", HeldJobs(request.owner),
                        " jobs, at most ", quota.max_running_jobs, " (",
                        config_->QuotaKey(request.owner, "max_running_jobs"), ")");
  }
  if (quota.max_workers > 0) {
    // The fewest workers it could run on.
    int fewest = request.workers;
    if (!request.fewer_replicas.empty() && request.stages > 0) {
      fewest = std::min(fewest, request.stages * request.fewer_replicas.back());
    }
    if (!request.fewer_stages.empty()) fewest = std::min(fewest, request.fewer_stages.back());
    const int held = Held(request.owner);
    if (held + fewest > quota.max_workers) {
      return absl::StrCat("quota: ", OwnerKey(request.owner), " holds ", held,
                          " workers and this job needs ", fewest, ", at most ", quota.max_workers,
                          " (", config_->QuotaKey(request.owner, "max_workers"), ")");
    }
  }
  return "";
}

std::vector<std::string> Scheduler::ClaimFor(const Request& request, int limit) {
  if (config_ != nullptr && usage_ != nullptr) {
    const int quota = config_->OwnerOf(request.owner).max_workers;
    if (quota > 0) limit = std::min(limit, quota - Held(request.owner));
  }
  std::vector<std::string> workers;
  if (request.workers <= limit) {
    workers = registry_->Claim(request.job_id, request.workers, request.distinct_identities,
                               request.stages, request.labels);
  }
  for (size_t i = 0; workers.empty() && request.stages > 0 && i < request.fewer_replicas.size();
       ++i) {
    const int n = request.stages * request.fewer_replicas[i];
    if (n > limit) continue;
    workers = registry_->Claim(request.job_id, n, request.distinct_identities, request.stages,
                               request.labels);
  }
  for (size_t i = 0; workers.empty() && i < request.fewer_stages.size(); ++i) {
    if (request.fewer_stages[i] > limit) continue;
    workers = registry_->Claim(request.job_id, request.fewer_stages[i], request.distinct_identities,
                               request.fewer_stages[i], request.labels);
  }
  return workers;
}

std::string Scheduler::WaitingText(const Request& request) const {
  const WorkerRegistry::Counts counts = registry_->GetCounts();
  const int idle = request.labels.empty() ? counts.idle : registry_->IdleWith(request.labels);
  // Enough idle workers, yet no claim: they share certificate identities.
  const bool identities = request.distinct_identities && idle >= request.workers;
  return absl::StrCat(
      "waiting for ", request.workers, " idle workers",
      request.labels.empty() ? "" : absl::StrCat(" labelled ", absl::StrJoin(request.labels, ", ")),
      request.fewer_replicas.empty() || request.stages <= 0
          ? ""
          : absl::StrCat(" (recovery.elastic: at least ",
                         request.stages * request.fewer_replicas.back(), ")"),
      request.fewer_stages.empty()
          ? ""
          : absl::StrCat(" (recovery.min_stages: at least ", request.fewer_stages.back(), ")"),
      identities ? " with distinct certificate identities" : "", " (",
      request.labels.empty() ? "" : absl::StrCat(idle, " of them idle, "), counts.idle, " idle, ",
      counts.registered, " registered",
      identities ? "; placement.distinct_identities: false lifts this" : "", ")");
}

Scheduler::Round Scheduler::Schedule(absl::Time now) {
  Round round;
  next_due_ = absl::InfiniteFuture();
  const bool classes = config_ != nullptr && !config_->classes.empty();
  // Idle workers that waiting jobs of a higher class need: a job of a lower
  // class is placed only on what is left (no backfill across classes).
  int reserved_higher = 0;
  int reserved_this_rank = 0;
  int rank_now = -1;
  std::string reserving_job;
  std::vector<bool> placed(queue_.size(), false);
  pass_held_.clear();
  // Read once; this pass's claims move workers from idle to busy.
  WorkerRegistry::Counts counts = registry_->GetCounts();
  for (size_t index : Order(now)) {
    Request& request = queue_[index];
    if (request.rank != rank_now) {
      reserved_higher += reserved_this_rank;
      reserved_this_rank = 0;
      rank_now = request.rank;
    }
    const std::string class_text =
        classes ? absl::StrCat("class ", config_->NameOf(request.rank), ": ") : "";
    Waiting waiting{request.job_id, "", Waiting::For::kWorkers, request.workers, request.rank};
    // What a waiting job of this class holds back for itself.
    // Not for a job that could never be placed on the connected workers, nor
    // one held back by certificate identities rather than by workers.
    const bool identities = request.distinct_identities && counts.idle >= request.workers;
    const int reserve = classes && request.labels.empty() && !identities &&
                                request.workers <= counts.idle + counts.busy
                            ? request.workers
                            : 0;
    if (request.not_before > now) {
      next_due_ = std::min(next_due_, request.not_before);
      // Keeps its place (and its reason: the loss) without a pass's verdict.
      reserved_this_rank += reserve;
      if (reserve > 0 && reserving_job.empty()) reserving_job = request.job_id;
      continue;
    }
    if (std::string quota = QuotaBlock(request); !quota.empty()) {
      waiting.waits_for = Waiting::For::kQuota;
      waiting.reason = absl::StrCat(class_text, quota);
      round.waiting.push_back(std::move(waiting));
      continue;
    }
    const int limit = reserved_higher > 0 ? counts.idle - reserved_higher : counts.registered;
    std::vector<std::string> workers = ClaimFor(request, limit);
    if (workers.empty()) {
      reserved_this_rank += reserve;
      if (reserved_higher > 0 && counts.idle >= request.workers) {
        waiting.waits_for = Waiting::For::kHigherClass;
        waiting.reason = absl::StrCat(class_text, "behind ", reserving_job,
                                      " of a higher class, which waits for ", reserved_higher,
                                      " of the ", counts.idle, " idle workers");
      } else {
        waiting.reason = absl::StrCat(class_text, WaitingText(request));
      }
      if (reserve > 0 && reserving_job.empty()) reserving_job = request.job_id;
      round.waiting.push_back(std::move(waiting));
      continue;
    }
    placed[index] = true;
    counts.idle -= static_cast<int>(workers.size());
    counts.busy += static_cast<int>(workers.size());
    pass_held_[request.owner].first += static_cast<int>(workers.size());
    pass_held_[request.owner].second += 1;
    round.placed.push_back({request.job_id, std::move(workers), request.profile});
  }
  std::vector<Request> still_queued;
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (!placed[i]) still_queued.push_back(std::move(queue_[i]));
  }
  queue_ = std::move(still_queued);
  return round;
}

v1::Command Scheduler::ProfileCommand(const std::string& job_id, const std::string& job_spec_yaml) {
  v1::Command c;
  c.mutable_profile()->set_job_id(job_id);
  c.mutable_profile()->set_job_spec_yaml(job_spec_yaml);
  return c;
}

absl::StatusOr<Scheduler::PlannedStages> Scheduler::PlanFromProfile(
    const JobSpec& spec, const std::vector<std::pair<int, int>>& ranges,
    const v1::ProfileResult& result, const std::vector<std::string>& workers,
    const std::map<std::string, v1::ProfileResult>* per_worker) const {
  auto profile = planner::ProfileFromProto(result.profile());
  if (!profile.ok()) {
    return absl::Status(profile.status().code(),
                        absl::StrCat("profile from the worker: ", profile.status().message()));
  }
  planner::PlanOptions options = planner::PlanOptionsForJob(spec, ranges);
  if (per_worker != nullptr) {
    // Stage j on the times of the worker in slot j (replica 0's).
    for (int j = 0; j < options.num_stages && j < static_cast<int>(workers.size()); ++j) {
      auto it = per_worker->find(workers[j]);
      if (it == per_worker->end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("no profile from worker ", workers[j], " (stage ", j, ")"));
      }
      auto own = planner::ProfileFromProto(it->second.profile());
      if (!own.ok()) {
        return absl::Status(own.status().code(), absl::StrCat("profile from worker ", workers[j],
                                                              ": ", own.status().message()));
      }
      options.stage_profiles.push_back(*std::move(own));
    }
  }
  if (options.memory_caps.empty()) {
    // The workers' own --memory-bytes, where every one of them says.
    // Replicated stages: a stage's cap is the smallest of its replicas'
    // (workers by slot, replica r's stage j at r * J + j).
    const size_t J = std::max<size_t>(1, ranges.size());
    std::vector<int64_t> caps;
    for (size_t slot = 0; slot < workers.size(); ++slot) {
      std::optional<v1::WorkerInfo> info = registry_->Info(workers[slot]);
      const int64_t cap = info.has_value() ? info->memory_bytes() : 0;
      if (slot < J) {
        caps.push_back(cap);
      } else {
        caps[slot % J] = std::min(caps[slot % J], cap);
      }
    }
    if (std::all_of(caps.begin(), caps.end(), [](int64_t c) { return c > 0; })) {
      options.memory_caps = caps;
    }
  }
  PlannedStages out;
  absl::StatusOr<planner::Plan> plan;
  if (options.algorithm == AlgorithmKind::kBackprop && !options.schedule.has_value()) {
    auto choice = planner::ChooseSchedule(*profile, options);
    if (choice.ok()) {
      out.cut.schedule = choice->schedule;
      for (const auto& [s, seconds] : choice->tried) {
        // plan.schedule.zb_h1 = its predicted seconds per mini-batch (-1: did not fit)
        out.summary.emplace_back(
            absl::StrCat("plan.schedule.", absl::StrReplaceAll(NameOf(s), {{"-", "_"}})), seconds);
      }
      plan = std::move(choice->plan);
    } else {
      plan = choice.status();
    }
  } else {
    plan = planner::MakePlan(*profile, options);
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("plan: ", plan.status().message()));
  }
  for (const planner::StagePlan& s : plan->stages) {
    out.cut.ranges.emplace_back(s.begin, s.end);
    std::vector<BlockMode> modes;
    for (int i = s.begin; i < s.end; ++i) {
      modes.push_back(s.store[i - s.begin] ? BlockMode::kStore : BlockMode::kRebuild);
    }
    out.cut.modes.push_back(std::move(modes));
    out.cut.wire.push_back({s.estimate.forward_wire, s.estimate.backward_wire});
    if (options.algorithm == AlgorithmKind::kDelayed && options.max_in_flight == kAutoInFlight) {
      out.cut.max_in_flight.push_back(s.role.inflight);
    }
  }
  for (auto& entry : planner::PlanSummary(*plan)) out.summary.push_back(std::move(entry));
  return out;
}

std::vector<v1::Command> Scheduler::StageAssignments(const std::string& job_id,
                                                     const std::string& job_spec_yaml,
                                                     const std::vector<std::string>& workers,
                                                     const Cut& cut, int replicas) const {
  const std::vector<std::pair<int, int>>& ranges = cut.ranges;
  const std::vector<std::vector<BlockMode>>& modes = cut.modes;
  std::vector<v1::Command> out;
  // Workers by slot: replica r's stage j at r * J + j.
  const size_t R = static_cast<size_t>(std::max(1, replicas));
  const size_t J = workers.size() / R;
  for (size_t slot = 0; slot < workers.size(); ++slot) {
    const size_t j = slot % J, r = slot / J;
    v1::Command c;
    v1::StageAssignment* a = c.mutable_configure();
    a->set_job_id(job_id);
    a->set_stage(static_cast<int>(j));
    a->set_num_stages(static_cast<int>(J));
    a->set_replica(static_cast<int>(r));
    a->set_num_replicas(static_cast<int>(R));
    if (j < ranges.size()) {
      a->set_block_begin(ranges[j].first);
      a->set_block_end(ranges[j].second);
    }
    if (R > 1) {
      std::optional<v1::WorkerInfo> self = registry_->Info(workers[slot]);
      if (self.has_value()) a->set_collective_host(HostOf(self->address()));
    }
    if (j + 1 < J) {
      std::optional<v1::WorkerInfo> next = registry_->Info(workers[slot + 1]);
      if (next.has_value()) a->set_next_address(next->address());
      a->set_next_identity(registry_->Identity(workers[slot + 1]));
    }
    if (j > 0) a->set_prev_identity(registry_->Identity(workers[slot - 1]));
    a->set_job_spec_yaml(job_spec_yaml);
    if (j < modes.size()) {
      for (BlockMode m : modes[j]) a->add_block_modes(planner::ToProto(m));
    }
    a->set_schedule(planner::ToProto(cut.schedule));
    // The plan's choices for this cut (a cut made without a plan has none).
    if (cut.wire.size() == J) {
      a->set_forward_compression(planner::ToProto(cut.wire[j].forward));
      a->set_backward_compression(planner::ToProto(cut.wire[j].backward));
    }
    if (cut.max_in_flight.size() == J) a->set_max_in_flight(cut.max_in_flight[j]);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace stagewise::coordinator
