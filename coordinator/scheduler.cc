#include "coordinator/scheduler.h"

#include <algorithm>
#include <cstdint>
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

void Scheduler::Enqueue(Request request) { queue_.push_back(std::move(request)); }

void Scheduler::Requeue(Request request) {
  Remove(request.job_id);
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

bool Scheduler::Queued(const std::string& job_id) const {
  return std::any_of(queue_.begin(), queue_.end(),
                     [&](const Request& r) { return r.job_id == job_id; });
}

Scheduler::Round Scheduler::Schedule(absl::Time now) {
  Round round;
  std::vector<Request> still_queued;
  next_due_ = absl::InfiniteFuture();
  for (Request& request : queue_) {
    if (request.not_before > now) {
      next_due_ = std::min(next_due_, request.not_before);
      still_queued.push_back(std::move(request));
      continue;
    }
    std::vector<std::string> workers =
        registry_->Claim(request.job_id, request.workers, request.distinct_identities,
                         request.stages, request.labels);
    for (size_t i = 0; workers.empty() && request.stages > 0 && i < request.fewer_replicas.size();
         ++i) {
      workers = registry_->Claim(request.job_id, request.stages * request.fewer_replicas[i],
                                 request.distinct_identities, request.stages, request.labels);
    }
    for (size_t i = 0; workers.empty() && i < request.fewer_stages.size(); ++i) {
      workers =
          registry_->Claim(request.job_id, request.fewer_stages[i], request.distinct_identities,
                           request.fewer_stages[i], request.labels);
    }
    if (workers.empty()) {
      const WorkerRegistry::Counts counts = registry_->GetCounts();
      const int idle = request.labels.empty() ? counts.idle : registry_->IdleWith(request.labels);
      // Enough idle workers, yet no claim: they share certificate identities.
      const bool identities = request.distinct_identities && idle >= request.workers;
      round.waiting.push_back(
          {request.job_id,
           absl::StrCat(
               "waiting for ", request.workers, " idle workers",
               request.labels.empty()
                   ? ""
                   : absl::StrCat(" labelled ", absl::StrJoin(request.labels, ", ")),
               request.fewer_replicas.empty() || request.stages <= 0
                   ? ""
                   : absl::StrCat(" (recovery.elastic: at least ",
                                  request.stages * request.fewer_replicas.back(), ")"),
               request.fewer_stages.empty() ? ""
                                            : absl::StrCat(" (recovery.min_stages: at least ",
                                                           request.fewer_stages.back(), ")"),
               identities ? " with distinct certificate identities" : "", " (",
               request.labels.empty() ? "" : absl::StrCat(idle, " of them idle, "), counts.idle,
               " idle, ", counts.registered, " registered",
               identities ? "; placement.distinct_identities: false lifts this" : "", ")")});
      still_queued.push_back(std::move(request));
      continue;
    }
    round.placed.push_back({request.job_id, std::move(workers), request.profile});
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
      out.schedule = choice->schedule;
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
    out.ranges.emplace_back(s.begin, s.end);
    std::vector<BlockMode> modes;
    for (int i = s.begin; i < s.end; ++i) {
      modes.push_back(s.store[i - s.begin] ? BlockMode::kStore : BlockMode::kRebuild);
    }
    out.modes.push_back(std::move(modes));
    out.wire.push_back({s.estimate.forward_wire, s.estimate.backward_wire});
  }
  for (auto& entry : planner::PlanSummary(*plan)) out.summary.push_back(std::move(entry));
  return out;
}

std::vector<v1::Command> Scheduler::StageAssignments(
    const std::string& job_id, const std::string& job_spec_yaml,
    const std::vector<std::string>& workers, const std::vector<std::pair<int, int>>& ranges,
    const std::vector<std::vector<BlockMode>>& modes, int replicas) const {
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
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace stagewise::coordinator
