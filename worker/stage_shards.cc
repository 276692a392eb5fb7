#include "worker/stage_shards.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/common/status_macros.h"
#include "services/training/optimizer.h"
#include "worker/reshard.h"
#include "worker/stage_replicas.h"
#include "worker/wire_residuals.h"

namespace stagewise::worker {

absl::StatusOr<StageShards::Written> StageShards::Write(const checkpoint::ShardPosition& at,
                                                        const SaveAlgorithm& algorithm) {
  checkpoint::ShardExtras extras;
  extras.algorithm = algorithm;
  // sync.every > 1: the anchors to resume from.
  if (StageReplicas* replicas = stage_.replicas()) {
    extras.outer_sync = [replicas](auto& archive) { return replicas->SaveOuter(archive); };
  }
  if (WireResiduals* residuals = stage_.wire_residuals()) {
    extras.wire_residuals = [residuals](auto& archive) { return residuals->Save(archive); };
  }
  extras.rng = true;
  STAGEWISE_ASSIGN_OR_RETURN(
      const std::string data,
      checkpoint::SerializeShard(at, stage_.model(), stage_.optimizer(), extras));
  Written written;
  written.path = checkpoint::StepDir(stage_.spec().checkpoint.dir, stage_.job_id(), at.step) + "/" +
                 checkpoint::ShardFileName(at.stage);
  if (absl::Status s = checkpoint::WriteFileAtomically(written.path, data); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checkpoint.dir: ", s.message()));
  }
  written.bytes = static_cast<int64_t>(data.size());
  written.crc32 = checkpoint::Crc32(data);
  return written;
}

absl::StatusOr<std::unique_ptr<checkpoint::ShardReader>> StageShards::ReadChecked(
    const std::string& path, int64_t bytes, uint32_t crc32, const v1::ResumePoint& resume,
    int block_begin, int block_end) const {
  STAGEWISE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardReader> shard,
                             checkpoint::ReadShardFile(path, bytes, crc32, device_));
  const checkpoint::ShardPosition& at = shard->position();
  if (at.step != resume.step() || at.phase != resume.phase() ||
      at.phase_step != resume.phase_step() || at.block_begin != block_begin ||
      at.block_end != block_end) {
    return absl::DataLossError(absl::StrCat(
        path, ": holds step ", at.step, " (phase ", at.phase, ", step ", at.phase_step,
        ") of stage ", at.stage, ", blocks [", at.block_begin, ", ", at.block_end,
        "); the resume point says step ", resume.step(), " (phase ", resume.phase(), ", step ",
        resume.phase_step(), "), blocks [", block_begin, ", ", block_end, ")"));
  }
  return shard;
}

absl::StatusOr<StageShards::Restored> StageShards::Load(const v1::ResumePoint& resume,
                                                        const EnterPosition& enter) {
  // The stage's own shard, or (on another cut) every shard with its blocks.
  const bool resharded = resume.sources_size() > 0;
  std::vector<std::unique_ptr<checkpoint::ShardReader>> archives;
  std::vector<ReshardSource> sources;
  if (!resharded) {
    STAGEWISE_ASSIGN_OR_RETURN(
        archives.emplace_back(),
        ReadChecked(resume.shard_path(), resume.shard_bytes(), resume.shard_crc32(), resume,
                    assignment_.block_begin(), assignment_.block_end()));
    if (const int64_t saved = archives[0]->position().stage; saved != stage_.stage()) {
      return absl::DataLossError(absl::StrCat(resume.shard_path(), ": holds stage ", saved,
                                              ", the resume point says stage ", stage_.stage()));
    }
  }
  for (const v1::ResumeShard& source : resume.sources()) {
    STAGEWISE_ASSIGN_OR_RETURN(archives.emplace_back(),
                               ReadChecked(source.path(), source.bytes(), source.crc32(), resume,
                                           source.block_begin(), source.block_end()));
    sources.push_back(
        {source.path(), source.block_begin(), source.block_end(), archives.back().get()});
  }
  const std::string& where = resharded ? resume.sources(0).path() : resume.shard_path();
  checkpoint::ShardPosition at = archives[0]->position();
  at.step = resume.step();
  at.phase = resume.phase();
  at.phase_step = resume.phase_step();
  STAGEWISE_RETURN_IF_ERROR(enter(at, where));
  checkpoint::ShardReader& shard = *archives[0];
  if (resharded) {
    const JobSpec& spec = stage_.spec();
    const torch::Device device = device_;
    STAGEWISE_RETURN_IF_ERROR(RegroupShards(
        sources, stage_.model(), stage_.optimizer(),
        [&spec, device](int begin, int end) -> absl::StatusOr<std::shared_ptr<models::Model>> {
          auto built = models::BuildModel(spec.model, static_cast<uint64_t>(spec.seed), begin, end);
          if (built.ok()) (*built)->to(device);
          return built;
        },
        [&spec](models::Model& m) { return training::MakeOptimizer(spec.optimizer, m); }));
  } else {
    STAGEWISE_RETURN_IF_ERROR(shard.LoadModel(stage_.model()));
    STAGEWISE_RETURN_IF_ERROR(shard.LoadOptimizer(stage_.optimizer()));
  }
  // On another cut: the random stream of the shard that held the stage's
  // first block.
  if (!shard.RestoreRng()) return absl::DataLossError(absl::StrCat(where, ": no random state"));
  Restored restored;
  restored.step = at.step;
  restored.phase_step = at.phase_step;
  restored.resharded = resharded;
  // Replicated stages with sync.every > 1 are never resharded (job_spec.cc
  // refuses recovery.min_stages with replicas).
  StageReplicas* replicas = stage_.replicas();
  if (torch::serialize::InputArchive outer; !resharded && replicas && shard.OuterSync(outer)) {
    STAGEWISE_RETURN_IF_ERROR(replicas->LoadOuter(outer));
  }
  WireResiduals* residuals = stage_.wire_residuals();
  if (torch::serialize::InputArchive saved; !resharded && residuals && shard.WireResiduals(saved)) {
    STAGEWISE_RETURN_IF_ERROR(residuals->Load(saved, device_));
  }
  const checkpoint::ShardPosition::Marks& marks = shard.position().marks;
  if (assignment_.replacing() && (!marks.known() || resharded)) {
    return absl::UnavailableError(absl::StrCat(
        where, ": no message counts (written before recovery.replay): cannot replay from it"));
  }
  if (!resharded) restored.marks = marks;
  if (at.phase_step > 0 && !resharded) {
    restored.algorithm = shard.Algorithm();
    restored.archive = std::move(archives[0]);  // the algorithm's state may rely on it
  }
  return restored;
}

absl::StatusOr<StageShards::Restored> StageShards::LoadCopy(
    std::unique_ptr<checkpoint::ShardReader> copy, const std::string& where,
    const EnterPosition& enter) {
  const checkpoint::ShardPosition at = copy->position();
  STAGEWISE_RETURN_IF_ERROR(enter(at, where));
  STAGEWISE_RETURN_IF_ERROR(copy->LoadModel(stage_.model()));
  STAGEWISE_RETURN_IF_ERROR(copy->LoadOptimizer(stage_.optimizer()));
  if (!copy->RestoreRng()) return absl::DataLossError(absl::StrCat(where, ": no random state"));
  Restored restored;
  restored.step = at.step;
  restored.phase_step = at.phase_step;
  restored.marks = at.marks;
  if (at.phase_step > 0) {
    restored.algorithm = copy->Algorithm();
    restored.archive = std::move(copy);  // the algorithm's state may rely on it
  }
  return restored;
}

}  // namespace stagewise::worker
