// StageRuntime's checkpoints (services/checkpoint/shard_archive.h): the
// shards it writes, the resume from one, and a replacing replica's start from
// a surviving replica's state (worker/replica_copy.h copies it).
#include <chrono>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/status_macros.h"
#include "services/training/optimizer.h"
#include "worker/algorithms/common.h"
#include "worker/reshard.h"
#include "worker/stage_runtime.h"

namespace stagewise::worker {

absl::StatusOr<std::unique_ptr<checkpoint::ShardReader>> StageRuntime::ReadResumeShard(
    const std::string& path, int64_t bytes, uint32_t crc32, const v1::ResumePoint& resume,
    int block_begin, int block_end) const {
  STAGEWISE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardReader> shard,
                             checkpoint::ReadShardFile(path, bytes, crc32, env_.device));
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
  at.marks = streams_->marks();
  checkpoint::ShardExtras extras;
  if (with_algorithm) {
    extras.algorithm = [this](torch::serialize::OutputArchive& archive) {
      return algorithm_->SaveState(*this, archive);
    };
  }
  // sync.every > 1: the anchors to resume from.
  extras.outer_sync = [this](auto& archive) { return replicas_->SaveOuter(archive); };
  extras.wire_residuals = [this](auto& archive) { return wire_residuals_.Save(archive); };
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
  v1::WorkerEvent event = reporter_->NewEvent();
  auto* saved = event.mutable_checkpoint_saved();
  saved->set_step(step);
  saved->set_phase(phase_);
  saved->set_phase_step(phase_step);
  saved->set_path(path);
  saved->set_bytes(static_cast<int64_t>(data.size()));
  saved->set_crc32(checkpoint::Crc32(data));
  saved->set_seconds(SecondsSince(t0));
  reporter_->Emit(std::move(event));
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
        ReadResumeShard(resume.shard_path(), resume.shard_bytes(), resume.shard_crc32(), resume,
                        assignment_.block_begin(), assignment_.block_end()));
    if (const int64_t saved = archives[0]->position().stage; saved != stage()) {
      return absl::DataLossError(absl::StrCat(resume.shard_path(), ": holds stage ", saved,
                                              ", the resume point says stage ", stage()));
    }
  }
  for (const v1::ResumeShard& source : resume.sources()) {
    STAGEWISE_ASSIGN_OR_RETURN(archives.emplace_back(),
                               ReadResumeShard(source.path(), source.bytes(), source.crc32(),
                                               resume, source.block_begin(), source.block_end()));
    sources.push_back(
        {source.path(), source.block_begin(), source.block_end(), archives.back().get()});
  }
  const std::string& where = resharded ? resume.sources(0).path() : resume.shard_path();
  const int64_t step = resume.step(), phase = resume.phase(), phase_step = resume.phase_step();
  STAGEWISE_RETURN_IF_ERROR(EnterResumedPhase(step, phase, phase_step, where));
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
  if (torch::serialize::InputArchive residuals; !resharded && shard.WireResiduals(residuals)) {
    STAGEWISE_RETURN_IF_ERROR(wire_residuals_.Load(residuals, env_.device));
  }
  // The messages the stage had sent and taken there (a replacement replays
  // from them; a resumed attempt goes on numbering).
  const checkpoint::ShardPosition::Marks& marks = shard.position().marks;
  if (assignment_.replacing() && (!marks.known() || resharded)) {
    return absl::UnavailableError(absl::StrCat(
        where, ": no message counts (written before recovery.replay): cannot replay from it"));
  }
  SetResumed(step, phase_step, resharded ? checkpoint::ShardPosition::Marks{} : marks);
  return absl::OkStatus();
}

absl::Status StageRuntime::EnterResumedPhase(int64_t step, int64_t phase, int64_t phase_step,
                                             const std::string& where) {
  if (phase < 0 || phase >= static_cast<int64_t>(phases_.size())) {
    return absl::DataLossError(
        absl::StrCat(where, ": phase ", phase, " of a job with ", phases_.size(), " phase(s)"));
  }
  for (int p = 1; p <= phase; ++p) STAGEWISE_RETURN_IF_ERROR(EnterPhase(p));
  if (phase_step < 0 || phase_step > phase_steps_ || phase_offset_ + phase_step != step) {
    return absl::DataLossError(
        absl::StrCat(where, ": step ", phase_step, " of phase ", phase, " does not fit this job"));
  }
  return absl::OkStatus();
}

void StageRuntime::SetResumed(int64_t step, int64_t phase_step,
                              const checkpoint::ShardPosition::Marks& marks) {
  if (marks.known()) {
    streams_->Resume(marks);
    resumed_marks_ = marks;
  }
  resumed_step_ = step;
  start_phase_ = phase_;
  first_step_ = phase_step;
  resumed_at_end_ = step == total_steps_;
  absl::MutexLock lock(&mu_);
  released_phase_ = start_phase_;
}

// --- replacing a replica (worker/replica_copy.h) --------------------------

void StageRuntime::BeginStep(int64_t phase_step) {
  if (assignment_.replay() && num_replicas() > 1) {
    replica_copy_.NoteStepStart(phase_step, streams_->marks(), *model_);
  }
}

void StageRuntime::ReplicaRegroup(const v1::ReplicaRegroup& regroup) {
  replicas_->Regroup(regroup.generation(), regroup.source_replica() == replica(), regroup.token());
}

absl::Status StageRuntime::LoadReplicaCopy() {
  STAGEWISE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardReader> shard,
                             replica_copy_.Fetch(
                                 assignment_, env_.rpc, env_.collective_timeout,
                                 [this] { return !Interrupted().ok(); }, env_.device));
  const checkpoint::ShardPosition at = shard->position();
  const std::string where = absl::StrCat("the copy of stage ", stage(), " from replica ",
                                         assignment_.replica_source().replica());
  STAGEWISE_RETURN_IF_ERROR(EnterResumedPhase(at.step, at.phase, at.phase_step, where));
  STAGEWISE_RETURN_IF_ERROR(shard->LoadModel(*model_));
  STAGEWISE_RETURN_IF_ERROR(shard->LoadOptimizer(*optimizer_));
  if (!shard->RestoreRng()) return absl::DataLossError(absl::StrCat(where, ": no random state"));
  if (at.phase_step > 0) {
    resume_state_ = shard->Algorithm();
    resume_archive_ = std::move(shard);  // resume_state_ may rely on it
  }
  SetResumed(at.step, at.phase_step, at.marks);
  return absl::OkStatus();
}

}  // namespace stagewise::worker
