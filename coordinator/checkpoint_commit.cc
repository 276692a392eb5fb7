#include "coordinator/checkpoint_commit.h"

#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/checkpoint/checkpoint.h"
#include "services/common/log.h"

namespace stagewise::coordinator {

void CheckpointCommitter::OnShardSaved(const std::string& job_id, LiveJob& job, int stage,
                                       const v1::CheckpointSaved& saved) {
  if (job.spec.checkpoint.dir.empty()) return;
  if (stage < 0 || stage >= NumStages(job)) return;  // replica 0's shards (one per stage)
  // A replacing stage (recovery.replay) writes again what was committed.
  if (job.spec.recovery.replay && saved.step() <= job.status.last_checkpoint_step()) {
    std::error_code ec;
    const std::string manifest =
        checkpoint::StepDir(job.spec.checkpoint.dir, job_id, saved.step()) + "/" +
        checkpoint::kManifestName;
    if (std::filesystem::exists(manifest, ec)) return;
  }
  // Uncommitted checkpoints are few (a stage lags its peers by a step or two):
  // keep the newest 16 so no sender can grow the map.
  while (job.attempt.shards.size() >= 16 && job.attempt.shards.count(saved.step()) == 0) {
    job.attempt.shards.erase(job.attempt.shards.begin());
  }
  std::map<int, v1::CheckpointSaved>& stages = job.attempt.shards[saved.step()];
  stages[stage] = saved;
  if (static_cast<int>(stages.size()) == NumStages(job)) Commit(job_id, job, saved.step());
}

void CheckpointCommitter::Commit(const std::string& job_id, LiveJob& job, int64_t step) {
  const std::map<int, v1::CheckpointSaved> stages = std::move(job.attempt.shards[step]);
  job.attempt.shards.erase(job.attempt.shards.begin(), job.attempt.shards.upper_bound(step));
  const std::string& root = job.spec.checkpoint.dir;
  const std::string dir = checkpoint::StepDir(root, job_id, step);
  v1::CheckpointManifest m;
  m.set_format(checkpoint::kFormat);
  m.set_job_id(job_id);
  m.set_step(step);
  m.set_phase(stages.begin()->second.phase());
  m.set_phase_step(stages.begin()->second.phase_step());
  m.set_total_steps(job.status.total_steps());
  m.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  m.set_attempt(job.attempt_number);
  m.set_job_spec_yaml(job.yaml);
  absl::Status problem;
  for (const auto& [stage, saved] : stages) {
    v1::CheckpointShard* shard = m.add_shards();
    shard->set_stage(stage);
    shard->set_file(checkpoint::ShardFileName(stage));
    shard->set_bytes(saved.bytes());
    shard->set_crc32(saved.crc32());
    shard->set_block_begin(job.cut.ranges.at(stage).first);
    shard->set_block_end(job.cut.ranges.at(stage).second);
    if (static_cast<size_t>(stage) < job.cut.modes.size()) {
      checkpoint::SetShardModes(job.cut.modes[stage], shard);
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
    host_->UpdateProgress(
        job, absl::StrCat("checkpoint at step ", step, " NOT committed: ", problem.message()), {});
    return;
  }
  metrics_->CountCheckpoint();
  job.status.set_last_checkpoint_step(step);
  auto pruned = checkpoint::Prune(root, job_id, job.spec.checkpoint.keep);
  if (!pruned.ok()) STAGEWISE_LOG(WARNING) << "job " << job_id << ": " << pruned.status();
  host_->UpdateProgress(job, absl::StrCat("checkpoint at step ", step, " committed"), {});
  if (job.spec.recovery.replay) {
    // The stages drop what they kept from before it.
    for (const std::string& worker : DistinctWorkers(job)) {
      v1::Command command;
      v1::CheckpointCommitted* c = command.mutable_checkpoint_committed();
      c->set_job_id(job_id);
      c->set_attempt(job.attempt_number);
      c->set_step(step);
      host_->Send(worker, std::move(command));
    }
  }
}

}  // namespace stagewise::coordinator
