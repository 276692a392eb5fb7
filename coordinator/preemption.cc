#include "coordinator/preemption.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/log.h"

namespace stagewise::coordinator {
namespace {

// The fewest workers the job may run on: its stages times its fewest
// elastic replicas, or recovery.min_stages; all of them otherwise.
int SmallestSize(const LiveJob& job, int have) {
  int smallest = have;
  const std::vector<int> replicas = ElasticReplicaCounts(job);
  if (!replicas.empty()) smallest = std::min(smallest, NumWorkerStages(job) * replicas.back());
  if (job.spec.recovery.min_stages > 0 && ChunksPerWorker(job) == 1 && SpecReplicas(job) == 1) {
    smallest = std::min(smallest, std::max(1, job.spec.recovery.min_stages));
  }
  return smallest;
}

// What stopping the job frees: all of its `matching` workers, or for a job
// that may run smaller, those above its smallest size.
int Frees(const LiveJob& job, int matching) {
  const int have = static_cast<int>(DistinctWorkers(job).size());
  const int smallest = SmallestSize(job, have);
  return smallest < have ? std::min(matching, have - smallest) : matching;
}

}  // namespace

int RankOfJob(const SharingConfig& config, const LiveJob& job) {
  // A class set since submission (SetPriority) is the status's.
  for (const std::string& name : {job.status.priority(), job.spec.priority}) {
    if (name.empty()) continue;
    if (absl::StatusOr<int> rank = config.RankOf(name); rank.ok()) return *rank;
  }
  return config.RankOf("").value_or(0);
}

std::vector<Preemptor::Victim> Preemptor::Candidates(int rank,
                                                     const std::vector<std::string>& labels) {
  std::vector<Victim> victims;
  for (const std::string& id : host_->LiveJobIds()) {
    const LiveJob& job = *host_->FindJob(id);
    const int job_rank = RankOfJob(*config_, job);
    if (job_rank <= rank || job.status.state() != v1::RUNNING || job.attempt.planned_stop ||
        job.spec.checkpoint.dir.empty() || job.attempt.replacement) {
      continue;
    }
    const std::vector<std::string> workers = DistinctWorkers(job);
    int matching = 0;
    for (const std::string& w : workers) {
      std::optional<v1::WorkerInfo> info = registry_->Info(w);
      if (info && HasLabels(*info, labels)) ++matching;
    }
    const int frees = Frees(job, matching);
    if (frees > 0) victims.push_back({id, job_rank, job.attempt.started, frees});
  }
  std::sort(victims.begin(), victims.end(), [](const Victim& a, const Victim& b) {
    if (a.rank != b.rank) return a.rank > b.rank;
    if (a.started != b.started) return a.started > b.started;
    return a.job_id < b.job_id;
  });
  return victims;
}

int Preemptor::Freeing(const std::string& job_id) {
  int freeing = 0;
  for (const std::string& id : host_->LiveJobIds()) {
    const LiveJob& job = *host_->FindJob(id);
    if (job.attempt.planned_stop && job.attempt.planned_stop->for_job == job_id) {
      freeing += Frees(job, static_cast<int>(DistinctWorkers(job).size()));
    }
  }
  return freeing;
}

int Preemptor::AfterPass(const std::vector<Scheduler::Waiting>& waiting) {
  if (config_ == nullptr || config_->classes.empty()) return 0;
  int begun = 0;
  // Idle workers an earlier (higher) waiting job of this pass counts on.
  int promised = 0;
  for (const Scheduler::Waiting& w : waiting) {
    if (w.waits_for != Scheduler::Waiting::For::kWorkers) continue;
    LiveJob* waiter = host_->FindJob(w.job_id);
    if (waiter == nullptr) continue;
    const std::vector<std::string> labels = PlacementLabels(waiter->spec);
    const int idle = std::max(0, registry_->IdleWith(labels) - promised);
    if (!config_->Preempts(w.rank)) {
      // It stops nobody, but the idle workers it waits for are its (the
      // scheduler keeps lower classes off them).
      promised += std::min(idle, w.workers);
      continue;
    }
    const int freeing = Freeing(w.job_id);
    int needed = w.workers - idle - freeing;
    if (needed <= 0) {
      promised += std::max(0, w.workers - freeing);
      continue;
    }
    std::vector<Victim> chosen;
    for (const Victim& v : Candidates(w.rank, labels)) {
      if (needed <= 0) break;
      chosen.push_back(v);
      needed -= v.frees;
    }
    if (needed > 0) continue;  // not even all of them would make room
    promised += idle;
    const std::string class_name = config_->NameOf(w.rank);
    for (const Victim& v : chosen) {
      LiveJob& job = *host_->FindJob(v.job_id);
      const int have = static_cast<int>(DistinctWorkers(job).size());
      const bool shrinks = SmallestSize(job, have) < have;
      // recovery.min_stages: the next placement may take fewer stages.
      Handover handover;
      handover.fewer_stages = shrinks && job.spec.recovery.min_stages > 0;
      handover.wait_unbounded = true;
      const std::string reason =
          absl::StrCat("preempted by job ", w.job_id, " (class ", class_name, ", waiting for ",
                       w.workers, " workers)", shrinks ? ": resuming on fewer workers" : "");
      if (!planned_->Begin(v.job_id, job, reason, v1::END_CAUSE_PRIORITY, std::move(handover),
                           w.job_id)) {
        continue;
      }
      ++begun;
      STAGEWISE_LOG(INFO) << "job " << v.job_id << ": " << reason;
      host_->UpdateProgress(
          *waiter,
          absl::StrCat("preempting job ", v.job_id, " (class ", config_->NameOf(v.rank), ") for ",
                       v.frees, " worker", v.frees == 1 ? "" : "s"),
          {});
    }
  }
  return begun;
}

}  // namespace stagewise::coordinator
