// StageRuntime's checkpoints (services/checkpoint/checkpoint.h): the shard
// it writes at a cut and the resume from a committed checkpoint, on the
// checkpoint's cut or on another one (worker/reshard.h).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/status_macros.h"
#include "services/training/optimizer.h"
#include "worker/algorithms/common.h"
#include "worker/reshard.h"
#include "worker/stage_runtime.h"

namespace stagewise::worker {

namespace {

// One shard of the checkpoint the stage resumes from, read, checked against
// its manifest entry and against the resume point: DATA_LOSS otherwise (that
// checkpoint is unusable, an older one may not be).
absl::StatusOr<std::unique_ptr<checkpoint::ShardReader>> ReadShard(const std::string& path,
                                                                   int64_t bytes, uint32_t crc32,
                                                                   const v1::ResumePoint& resume,
                                                                   int block_begin, int block_end,
                                                                   const torch::Device& device) {
  absl::StatusOr<std::string> read = checkpoint::ReadFile(path);
  if (!read.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint shard: ", read.status().message()));
  }
  const std::string& data = *read;
  if (absl::Status s = checkpoint::VerifyBytes(data, bytes, crc32, path); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  STAGEWISE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardReader> shard,
                             checkpoint::ShardReader::Parse(data, device, path));
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

}  // namespace

absl::Status StageRuntime::WriteShard(int64_t phase_step, bool with_algorithm) {
  // Replicas of a stage are equal after every step: replica 0 writes the
  // stage's one shard (docs/replicas.md).
  if (replica() > 0) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t step = phase_offset_ + phase_step;
  checkpoint::ShardPosition at;
  at.step = step;
  at.phase = phase_;
  at.phase_step = phase_step;
  at.stage = stage();
  at.block_begin = assignment_.block_begin();
  at.block_end = assignment_.block_end();
  checkpoint::ShardExtras extras;
  if (with_algorithm) {
    extras.algorithm = [this](torch::serialize::OutputArchive& archive) {
      return algorithm_->SaveState(*this, archive);
    };
  }
  // sync.every > 1: the anchors to resume from.
  extras.outer_sync = [this](torch::serialize::OutputArchive& archive) {
    return replicas_->SaveOuter(archive);
  };
  extras.rng = true;
  STAGEWISE_ASSIGN_OR_RETURN(const std::string data,
                             checkpoint::SerializeShard(at, *model_, *optimizer_, extras));
  const std::string path = checkpoint::StepDir(spec_.checkpoint.dir, job_id(), step) + "/" +
                           checkpoint::ShardFileName(stage());
  if (absl::Status s = checkpoint::WriteFileAtomically(path, data); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checkpoint.dir: ", s.message()));
  }
  metrics_->ObserveCompute("checkpoint", SecondsSince(t0));
  if (tracer_)
    tracer_->Record(v1::SPAN_CHECKPOINT, phase_step, 0, t0, std::chrono::steady_clock::now());
  if (!env_.emit) return absl::OkStatus();
  v1::WorkerEvent event = NewEvent();
  auto* saved = event.mutable_checkpoint_saved();
  saved->set_step(step);
  saved->set_phase(phase_);
  saved->set_phase_step(phase_step);
  saved->set_path(path);
  saved->set_bytes(static_cast<int64_t>(data.size()));
  saved->set_crc32(checkpoint::Crc32(data));
  env_.emit(std::move(event));
  return absl::OkStatus();
}

absl::Status StageRuntime::LoadResume(const v1::ResumePoint& resume) {
  // The stage's own shard, or (on another cut) every shard with its blocks.
  const bool resharded = resume.sources_size() > 0;
  std::vector<std::unique_ptr<checkpoint::ShardReader>> archives;
  std::vector<ReshardSource> sources;
  if (!resharded) {
    STAGEWISE_ASSIGN_OR_RETURN(
        archives.emplace_back(),
        ReadShard(resume.shard_path(), resume.shard_bytes(), resume.shard_crc32(), resume,
                  assignment_.block_begin(), assignment_.block_end(), env_.device));
    if (const int64_t saved = archives[0]->position().stage; saved != stage()) {
      return absl::DataLossError(absl::StrCat(resume.shard_path(), ": holds stage ", saved,
                                              ", the resume point says stage ", stage()));
    }
  }
  for (const v1::ResumeShard& source : resume.sources()) {
    STAGEWISE_ASSIGN_OR_RETURN(archives.emplace_back(),
                               ReadShard(source.path(), source.bytes(), source.crc32(), resume,
                                         source.block_begin(), source.block_end(), env_.device));
    sources.push_back(
        {source.path(), source.block_begin(), source.block_end(), archives.back().get()});
  }
  const std::string& where = resharded ? resume.sources(0).path() : resume.shard_path();
  const int64_t step = resume.step(), phase = resume.phase(), phase_step = resume.phase_step();
  if (phase < 0 || phase >= static_cast<int64_t>(phases_.size())) {
    return absl::DataLossError(
        absl::StrCat(where, ": phase ", phase, " of a job with ", phases_.size(), " phase(s)"));
  }
  for (int p = 1; p <= phase; ++p) STAGEWISE_RETURN_IF_ERROR(EnterPhase(p));
  if (phase_step < 0 || phase_step > phase_steps_ || phase_offset_ + phase_step != step) {
    return absl::DataLossError(
        absl::StrCat(where, ": step ", phase_step, " of phase ", phase, " does not fit this job"));
  }
  checkpoint::ShardReader& shard = *archives[0];
  if (resharded) {
    STAGEWISE_RETURN_IF_ERROR(RegroupShards(
        sources, *model_, *optimizer_,
        [this](int begin, int end) -> absl::StatusOr<std::shared_ptr<models::Model>> {
          auto built =
              models::BuildModel(spec_.model, static_cast<uint64_t>(spec_.seed), begin, end);
          if (built.ok()) (*built)->to(env_.device);
          return built;
        },
        [this](models::Model& m) { return training::MakeOptimizer(spec_.optimizer, m); }));
  } else {
    STAGEWISE_RETURN_IF_ERROR(shard.LoadModel(*model_));
    STAGEWISE_RETURN_IF_ERROR(shard.LoadOptimizer(*optimizer_));
  }
  // On another cut: the random stream of the shard that held the stage's
  // first block.
  if (!shard.RestoreRng()) return absl::DataLossError(absl::StrCat(where, ": no random state"));
  if (phase_step > 0 && !resharded) {
    resume_state_ = shard.Algorithm();
    resume_archive_ = std::move(archives[0]);  // resume_state_ may rely on it
  }
  resharded_ = resharded && phase_step > 0;
  // Replicated stages with sync.every > 1 are never resharded (job_spec.cc
  // refuses recovery.min_stages with replicas).
  if (torch::serialize::InputArchive outer; !resharded && shard.OuterSync(outer)) {
    STAGEWISE_RETURN_IF_ERROR(replicas_->LoadOuter(outer));
  }
  start_phase_ = static_cast<int>(phase);
  first_step_ = phase_step;
  resumed_at_end_ = step == total_steps_;
  {
    absl::MutexLock lock(&mu_);
    released_phase_ = start_phase_;
  }
  return absl::OkStatus();
}

}  // namespace stagewise::worker
