// StageRuntime's checkpoints (services/checkpoint/checkpoint.h): the shard
// it writes at a cut and the resume from a committed checkpoint, on the
// checkpoint's cut or on another one (worker/reshard.h).
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/common/status_macros.h"
#include "services/training/optimizer.h"
#include "worker/algorithms/common.h"
#include "worker/reshard.h"
#include "worker/stage_runtime.h"

namespace stagewise::worker {

namespace {
torch::Tensor Scalar(int64_t v) { return torch::tensor(v, torch::kInt64); }
int64_t ReadScalar(torch::serialize::InputArchive& a, const std::string& key) {
  torch::Tensor t;
  a.read(key, t);
  return t.item<int64_t>();
}

// One shard of the checkpoint the stage resumes from, read, checked against
// its manifest entry and against the resume point: DATA_LOSS otherwise (that
// checkpoint is unusable, an older one may not be).
absl::StatusOr<std::unique_ptr<torch::serialize::InputArchive>> ReadShard(
    const std::string& path, int64_t bytes, uint32_t crc32, const v1::ResumePoint& resume,
    int block_begin, int block_end, const torch::Device& device) {
  absl::StatusOr<std::string> read = checkpoint::ReadFile(path);
  if (!read.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint shard: ", read.status().message()));
  }
  const std::string& data = *read;
  if (absl::Status s = checkpoint::VerifyBytes(data, bytes, crc32, path); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  auto archive = std::make_unique<torch::serialize::InputArchive>();
  archive->load_from(data.data(), data.size(), device);
  const int64_t step = ReadScalar(*archive, "step");
  const int64_t phase = ReadScalar(*archive, "phase");
  const int64_t phase_step = ReadScalar(*archive, "phase_step");
  const int64_t begin = ReadScalar(*archive, "block_begin");
  const int64_t end = ReadScalar(*archive, "block_end");
  if (step != resume.step() || phase != resume.phase() || phase_step != resume.phase_step() ||
      begin != block_begin || end != block_end) {
    return absl::DataLossError(absl::StrCat(
        path, ": holds step ", step, " (phase ", phase, ", step ", phase_step, ") of stage ",
        ReadScalar(*archive, "stage"), ", blocks [", begin, ", ", end,
        "); the resume point says step ", resume.step(), " (phase ", resume.phase(), ", step ",
        resume.phase_step(), "), blocks [", block_begin, ", ", block_end, ")"));
  }
  return archive;
}
}  // namespace

absl::Status StageRuntime::WriteShard(int64_t phase_step, bool with_algorithm) {
  // Replicas of a stage are equal after every step: replica 0 writes the
  // stage's one shard (docs/replicas.md).
  if (replica() > 0) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t step = phase_offset_ + phase_step;
  torch::serialize::OutputArchive archive;
  {
    torch::serialize::OutputArchive model;
    model_->save(model);
    archive.write("model", model);
  }
  {
    torch::serialize::OutputArchive optimizer;
    optimizer_->save(optimizer);
    archive.write("optimizer", optimizer);
  }
  {
    torch::serialize::OutputArchive algorithm;
    if (with_algorithm) STAGEWISE_RETURN_IF_ERROR(algorithm_->SaveState(*this, algorithm));
    archive.write("algorithm", algorithm);
  }
  // sync.every > 1: the anchors to resume from.
  if (torch::serialize::OutputArchive outer; replicas_->SaveOuter(outer)) {
    archive.write("outer_sync", outer);
  }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    archive.write("rng", gen.get_state());
  }
  archive.write("step", Scalar(step));
  archive.write("phase", Scalar(phase_));
  archive.write("phase_step", Scalar(phase_step));
  archive.write("stage", Scalar(stage()));
  archive.write("block_begin", Scalar(assignment_.block_begin()));
  archive.write("block_end", Scalar(assignment_.block_end()));
  std::ostringstream bytes;
  archive.save_to(bytes);
  const std::string data = std::move(bytes).str();
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
  std::vector<std::unique_ptr<torch::serialize::InputArchive>> archives;
  std::vector<ReshardSource> sources;
  if (!resharded) {
    STAGEWISE_ASSIGN_OR_RETURN(
        archives.emplace_back(),
        ReadShard(resume.shard_path(), resume.shard_bytes(), resume.shard_crc32(), resume,
                  assignment_.block_begin(), assignment_.block_end(), env_.device));
    if (const int64_t saved = ReadScalar(*archives[0], "stage"); saved != stage()) {
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
  torch::serialize::InputArchive& archive = *archives[0];
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
    torch::serialize::InputArchive model, optimizer;
    archive.read("model", model);
    model_->load(model);
    archive.read("optimizer", optimizer);
    optimizer_->load(optimizer);
  }
  {
    // On another cut: the random stream of the shard that held the stage's
    // first block.
    torch::Tensor rng;
    archive.read("rng", rng);
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  if (phase_step > 0 && !resharded) {
    resume_state_ = std::make_unique<torch::serialize::InputArchive>();
    archive.read("algorithm", *resume_state_);
    resume_archive_ = std::move(archives[0]);  // resume_state_ may rely on it
  }
  resharded_ = resharded && phase_step > 0;
  // Replicated stages with sync.every > 1 are never resharded (job_spec.cc
  // refuses recovery.min_stages with replicas).
  if (torch::serialize::InputArchive outer; !resharded && archive.try_read("outer_sync", outer)) {
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
