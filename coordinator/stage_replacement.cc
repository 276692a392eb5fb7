#include "coordinator/stage_replacement.h"

#include <set>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "services/checkpoint/checkpoint.h"
#include "services/common/log.h"

namespace stagewise::coordinator {

std::optional<v1::ResumePoint> StageReplacer::ResumeFrom(const std::string& job_id,
                                                         const LiveJob& job, int slot) const {
  std::optional<v1::ResumePoint> from;
  std::vector<std::string> skipped;
  for (checkpoint::Committed& c :
       checkpoint::ListCommitted(job.spec.checkpoint.dir, job_id, false, &skipped)) {
    // The attempt's own cut: the survivors kept what they sent since.
    bool same_cut = c.manifest.shards_size() == NumStages(job);
    for (int j = 0; same_cut && j < NumStages(job); ++j) {
      same_cut = c.manifest.shards(j).block_begin() == job.cut.ranges[j].first &&
                 c.manifest.shards(j).block_end() == job.cut.ranges[j].second;
    }
    if (same_cut) {
      from = ResumeFor(job, c, slot);
      break;
    }
  }
  // A newer shard of its own whose checkpoint waits for the other stages':
  // the survivors kept everything since the committed one.
  for (auto it = job.attempt.shards.rbegin(); it != job.attempt.shards.rend(); ++it) {
    const auto own = it->second.find(slot);
    if (own == it->second.end() || (from && it->first <= from->step())) continue;
    const v1::CheckpointSaved& saved = own->second;
    v1::ResumePoint r;
    r.set_step(saved.step());
    r.set_phase(saved.phase());
    r.set_phase_step(saved.phase_step());
    r.set_shard_path(saved.path());
    r.set_shard_bytes(saved.bytes());
    r.set_shard_crc32(saved.crc32());
    from = std::move(r);
    break;
  }
  return from;
}

bool StageReplacer::TryReplace(const std::string& job_id, LiveJob& job,
                               const std::string& lost_worker, const std::string& why) {
  if (!job.spec.recovery.replay || job.status.state() != v1::RUNNING || job.attempt.replacement ||
      ChunksPerWorker(job) != 1 || job.status.attempts_size() == 0) {
    return false;
  }
  int slot = -1;
  for (int s = 0; s < static_cast<int>(job.attempt.workers.size()); ++s) {
    if (job.attempt.workers[s] == lost_worker) slot = s;
  }
  if (slot < 0) return false;
  const int stages = NumStages(job), stage = slot % stages, replica = slot / stages;
  // Replicated: the spare copies a surviving replica's live state (the
  // lowest other one); else it loads the stage's newest shard.
  const int source = NumReplicas(job) > 1 ? (replica == 0 ? 1 : 0) : -1;
  const std::optional<v1::ResumePoint> from =
      source < 0 ? ResumeFrom(job_id, job, slot) : std::nullopt;
  // Without a checkpoint of this cut: the attempt's start, when it began at
  // step 0 (the survivors kept everything since).
  if (source < 0 && !from && job.status.attempts(job.status.attempts_size() - 1).from_step() != 0) {
    return false;
  }
  std::set<std::string> taken;
  if (job.spec.placement.distinct_identities) {
    for (const std::string& w : job.attempt.workers) {
      if (w != lost_worker) taken.insert(registry_->Identity(w));
    }
    taken.erase("");
  }
  const std::string spare = registry_->ClaimOne(job_id, slot, PlacementLabels(job.spec), taken);
  if (spare.empty()) {
    host_->UpdateProgress(
        job,
        absl::StrCat(why, ": no idle worker to replace stage ", stage,
                     NumReplicas(job) > 1 ? absl::StrCat(" of replica ", replica) : std::string(),
                     " on (recovery.replay); recovering from a checkpoint"),
        {});
    return false;
  }
  job.attempt.workers[slot] = spare;
  std::vector<v1::Command> commands = scheduler_->StageAssignments(
      job_id, job.yaml, job.attempt.workers, job.cut, NumReplicas(job));
  v1::Command configure = std::move(commands[slot]);
  v1::StageAssignment& a = *configure.mutable_configure();
  a.set_replay(job.spec.recovery.replay);
  a.set_attempt(job.attempt_number);
  a.set_replacing(true);
  if (from) *a.mutable_resume() = *from;
  configure.set_command_id(host_->NewCommandId());
  std::vector<v1::Command> regroups;
  if (source >= 0) {
    const int generation = ++job.attempt.replica_generations[stage];
    const std::string token = absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(bitgen_),
                                              absl::Uniform<uint64_t>(bitgen_));
    const std::string& from_worker = job.attempt.workers[SlotOf(job, stage, source)];
    const std::optional<v1::WorkerInfo> info = registry_->Info(from_worker);
    v1::ReplicaSource* rs = a.mutable_replica_source();
    rs->set_address(info ? info->address() : "");
    rs->set_identity(registry_->Identity(from_worker));
    rs->set_replica(source);
    rs->set_generation(generation);
    rs->set_token(token);
    for (int other = 0; other < NumReplicas(job); ++other) {
      if (other == replica) continue;
      v1::Command& command = regroups.emplace_back();
      command.set_command_id(host_->NewCommandId());
      v1::ReplicaRegroup* g = command.mutable_replica_regroup();
      g->set_job_id(job_id);
      g->set_attempt(job.attempt_number);
      g->set_stage(stage);
      g->set_generation(generation);
      g->set_source_replica(source);
      g->set_token(token);
    }
  }

  Attempt::Replacement r;
  r.slot = slot;
  r.worker = spare;
  r.configure_id = configure.command_id();
  r.lost = absl::Now();
  r.job_step = job.status.step();
  job.attempt.replacement = r;
  v1::JobAttempt* attempt = job.status.mutable_attempts(job.status.attempts_size() - 1);
  if (slot < attempt->workers_size()) attempt->set_workers(slot, spare);
  v1::StageReplacement* entry = attempt->add_replacements();
  entry->set_stage(stage);
  entry->set_replica(replica);
  entry->set_copied_from_replica(source);
  entry->set_lost_worker(lost_worker);
  entry->set_worker(spare);
  entry->set_lost_unix_ms(absl::ToUnixMillis(r.lost));
  entry->set_reason(why);
  entry->set_from_step(from ? from->step() : 0);
  entry->set_job_step(r.job_step);
  const std::string what = NumReplicas(job) > 1
                               ? absl::StrCat("stage ", stage, " of replica ", replica)
                               : absl::StrCat("stage ", stage);
  STAGEWISE_LOG(WARNING) << "job " << job_id << ": " << why << "; " << what << " goes on on worker "
                         << spare;
  host_->UpdateProgress(
      job,
      absl::StrCat(why, "; ", what, " is replaced on worker ", spare,
                   source >= 0 ? absl::StrCat(" from replica ", source, "'s live state")
                   : from      ? absl::StrCat(" from its shard at step ", from->step())
                               : std::string(" from the start"),
                   ", the other stages wait (recovery.replay)"),
      {});
  host_->Send(spare, std::move(configure));
  for (int other = 0, i = 0; other < NumReplicas(job); ++other) {
    if (other == replica) continue;
    host_->Send(job.attempt.workers[SlotOf(job, stage, other)], std::move(regroups[i++]));
  }
  return true;
}

bool StageReplacer::OnAck(int64_t command_id, const std::string& sender) {
  for (const std::string& id : host_->LiveJobIds()) {
    LiveJob& job = *host_->FindJob(id);
    if (!job.attempt.replacement) continue;
    Attempt::Replacement& r = *job.attempt.replacement;
    if (command_id == r.configure_id && sender == r.worker) {
      // The spare holds the stage: its neighbours reconnect to it.
      const std::optional<v1::WorkerInfo> info = registry_->Info(r.worker);
      // Its neighbours in its own pipeline (replica).
      const int stage = r.slot % NumStages(job);
      for (const int neighbour : {stage - 1, stage + 1}) {
        if (neighbour < 0 || neighbour >= NumStages(job)) continue;
        v1::Command command;
        command.set_command_id(host_->NewCommandId());
        v1::NeighbourReplaced* n = command.mutable_neighbour_replaced();
        n->set_job_id(id);
        n->set_attempt(job.attempt_number);
        n->set_stage(stage);
        n->set_address(info ? info->address() : "");
        n->set_identity(registry_->Identity(r.worker));
        r.neighbour_acks.insert(command.command_id());
        host_->Send(job.attempt.workers[r.slot - stage + neighbour], std::move(command));
      }
    } else if (r.neighbour_acks.erase(command_id) == 0) {
      continue;
    }
    if (r.neighbour_acks.empty() && !r.started) {
      // The neighbours take its streams now: it may dial and be dialed.
      r.started = true;
      v1::Command start;
      start.mutable_start()->set_job_id(id);
      start.mutable_start()->set_phase(job.status.phase());
      host_->Send(r.worker, std::move(start));
    }
    return true;
  }
  return false;
}

v1::StageReplacement* StageReplacer::Entry(LiveJob& job, int stage) {
  if (job.status.attempts_size() == 0) return nullptr;
  v1::JobAttempt* a = job.status.mutable_attempts(job.status.attempts_size() - 1);
  for (int i = a->replacements_size() - 1; i >= 0; --i) {
    if (a->replacements(i).stage() == stage) return a->mutable_replacements(i);
  }
  return nullptr;
}

void StageReplacer::OnReplayDone(LiveJob& job, int stage, const v1::ReplayDone& done) {
  v1::StageReplacement* entry = Entry(job, stage);
  if (entry == nullptr || entry->replayed_to_step() > 0) return;
  // A replica's copy: the step the survivors waited in.
  entry->set_from_step(done.from_step());
  entry->set_copied_bytes(done.copied_bytes());
  entry->set_copy_seconds(done.copy_seconds());
  entry->set_replayed_to_step(done.to_step());
  entry->set_steps_redone(std::max<int64_t>(0, done.to_step() - done.from_step()));
  entry->set_bytes(done.bytes());
  entry->set_replay_seconds(done.seconds());
  host_->UpdateProgress(
      job,
      absl::StrFormat("stage %d caught up: replayed steps %d to %d (%d kept messages, %.1f MB) "
                      "in %.1f s",
                      stage, done.from_step(), done.to_step(), done.messages(),
                      static_cast<double>(done.bytes()) / 1e6, done.seconds()),
      {});
}

void StageReplacer::OnProgress(LiveJob& job) {
  if (!job.attempt.replacement || !job.attempt.replacement->started ||
      job.status.step() <= job.attempt.replacement->job_step) {
    return;
  }
  const Attempt::Replacement r = *job.attempt.replacement;
  job.attempt.replacement.reset();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - r.lost);
  const int stage = r.slot % NumStages(job);
  if (v1::StageReplacement* entry = Entry(job, stage)) entry->set_full_speed_seconds(seconds);
  host_->UpdateProgress(
      job,
      absl::StrFormat("stage %d replaced: the job passed step %d again %.1f s after the loss",
                      stage, r.job_step, seconds),
      {});
}

}  // namespace stagewise::coordinator
