#include "coordinator/live_job.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/worker_registry.h"
#include "services/common/status_macros.h"
#include "services/data/sizes.h"
#include "services/models/plan.h"
#include "services/planner/plan_proto.h"

namespace stagewise::coordinator {

absl::StatusOr<Submission> PrepareSubmission(JobSpec parsed, const PathRoots& checkpoint_roots) {
  Submission out;
  out.spec = std::move(parsed);
  const JobSpec& spec = out.spec;
  // ParseJobSpec accepts only the algorithms of AlgorithmOptions
  // (services/spec/job_spec.h), each of which every worker constructs.
  STAGEWISE_ASSIGN_OR_RETURN(out.blocks, models::PlanModel(spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(out.cut.ranges, models::ResolvePartition(spec.stages, out.blocks));
  const bool reversible = std::any_of(out.blocks.begin(), out.blocks.end(),
                                      [](const models::BlockInfo& b) { return b.reversible; });
  // Modes the spec fixes (with `modes: auto` under a budget the plan picks).
  if (reversible && spec.stages.modes != BlockModes::kAuto) {
    for (const auto& [b, e] : out.cut.ranges) {
      std::vector<BlockMode>& modes = out.cut.modes.emplace_back();
      for (int i = b; i < e; ++i) {
        modes.push_back(out.blocks[i].reversible && spec.stages.modes == BlockModes::kRebuild
                            ? BlockMode::kRebuild
                            : BlockMode::kStore);
      }
    }
  }
  STAGEWISE_ASSIGN_OR_RETURN(out.steps_per_epoch, data::StepsPerEpoch(spec));
  if (!spec.checkpoint.dir.empty()) {
    if (auto dir = ConfinePath("checkpoint.dir", spec.checkpoint.dir, checkpoint_roots);
        !dir.ok()) {
      return dir.status();
    }
    // The coordinator writes the manifests: it must reach checkpoint.dir too.
    if (absl::Status s = checkpoint::ProbeWritable(spec.checkpoint.dir); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(s.message(),
                       " (the coordinator commits checkpoints there: mount the same volume on "
                       "the coordinator and every worker)"));
    }
  }
  return out;
}

v1::JobStatus InitialStatus(const Submission& submission, const std::string& owner) {
  const JobSpec& spec = submission.spec;
  v1::JobStatus st;
  st.set_name(spec.name);
  st.set_owner(owner);
  st.set_state(v1::PENDING);
  st.set_algorithm(spec.algorithm.name());
  if (IsText(spec.data.dataset)) {
    const DataSpec& d = spec.data;
    st.set_tokens_per_sample(
        d.min_sequence_length > 0
            ? 0.5 * static_cast<double>(d.min_sequence_length + d.sequence_length)
            : static_cast<double>(d.sequence_length));
  }
  const std::vector<PhaseSpec> phases = Phases(spec);
  st.set_num_phases(static_cast<int>(phases.size()));
  st.set_phase(0);
  st.set_phase_name(phases.front().name);
  st.set_num_stages(submission.cut.num_stages());
  st.set_num_replicas(spec.stages.replicas);
  if (spec.stages.chunks_per_worker > 1) st.set_chunks_per_worker(spec.stages.chunks_per_worker);
  st.set_total_steps(data::TotalSteps(spec, submission.steps_per_epoch));
  st.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  st.set_updated_unix_ms(st.created_unix_ms());
  st.set_last_checkpoint_step(-1);
  return st;
}

LiveJob MakeLiveJob(const v1::JobStatus& status, const Submission& submission,
                    const std::string& yaml) {
  LiveJob job;
  job.status = status;
  job.spec = submission.spec;
  job.yaml = yaml;
  job.cut = submission.cut;
  const JobSpec& spec = job.spec;
  const bool reversible = std::any_of(submission.blocks.begin(), submission.blocks.end(),
                                      [](const models::BlockInfo& b) { return b.reversible; });
  // An auto partition, auto modes under a budget, backprop's schedule: auto,
  // delayed's max_in_flight: auto on links with latency, or transport's
  // compression: auto need a profile first.
  const std::vector<PhaseSpec> phases = Phases(spec);  // a copy: Phases returns a temporary
  const auto* backprop = phases.front().algorithm.get_if<BackpropOptions>();
  const auto* delayed = phases.front().algorithm.get_if<DelayedOptions>();
  job.needs_plan =
      spec.stages.partition == Partition::kAuto ||
      (reversible && spec.stages.modes == BlockModes::kAuto && spec.stages.memory_budget > 0) ||
      (backprop != nullptr && !backprop->schedule.has_value()) ||
      (delayed != nullptr && delayed->max_in_flight == kAutoInFlight &&
       spec.placement.link_rtt_ms > 0) ||
      spec.transport.forward.compression == Compression::kAuto ||
      spec.transport.backward.compression == Compression::kAuto;
  // The plan chooses the modes: none fixed before it.
  if (job.needs_plan) job.cut.modes.clear();
  return job;
}

std::string AutoWireText(const LiveJob& job) {
  const bool forward = job.spec.transport.forward.compression == Compression::kAuto;
  const bool backward = job.spec.transport.backward.compression == Compression::kAuto;
  if ((!forward && !backward) || job.cut.wire.empty()) return "";
  std::string out;
  const int J = static_cast<int>(job.cut.wire.size());
  for (int j = 0; j < J; ++j) {
    std::string sends;
    if (backward && j > 0) absl::StrAppend(&sends, "backward ", NameOf(job.cut.wire[j].backward));
    if (forward && j + 1 < J) {
      absl::StrAppend(&sends, sends.empty() ? "" : ", ", "forward ",
                      NameOf(job.cut.wire[j].forward));
    }
    if (!sends.empty()) absl::StrAppend(&out, out.empty() ? "" : "; ", "stage ", j, " ", sends);
  }
  return absl::StrCat("; compression auto: ", out);
}

absl::StatusOr<std::string> CutStages(LiveJob& job, int count) {
  STAGEWISE_ASSIGN_OR_RETURN(const std::vector<models::BlockInfo> blocks,
                             models::PlanModel(job.spec.model));
  StagesSpec stages = job.spec.stages;
  stages.count = count;
  stages.partition = Partition::kBalanced;
  stages.ranges.clear();
  using Ranges = std::vector<std::pair<int, int>>;
  STAGEWISE_ASSIGN_OR_RETURN(Ranges ranges, models::ResolvePartition(stages, blocks));
  // compression: auto and the in-flight depths were chosen for the old cut.
  job.cut = job.cut.Recut(std::move(ranges));
  job.status.set_num_stages(count);
  return job.cut.Text();
}

absl::StatusOr<std::string> CutFewerStages(LiveJob& job, int count) {
  STAGEWISE_ASSIGN_OR_RETURN(const std::string cut, CutStages(job, count));
  job.fewer_stages = false;
  return absl::StrCat(
      "recovery.min_stages: this attempt runs ", count, " of ", job.spec.stages.count, " stages (",
      count, " workers were idle after recovery.wait_seconds), blocks ", cut,
      job.resume
          ? absl::StrCat(", the checkpoint at step ", job.resume->manifest.step(), " resharded")
          : "");
}

std::vector<std::string> PlacementLabels(const JobSpec& spec) {
  std::vector<std::string> labels = spec.placement.labels;
  if (spec.device == "cuda" || absl::StartsWith(spec.device, "cuda:")) {
    labels.push_back(kNeedsCudaLabel);
  }
  return labels;
}

v1::ResumePoint ResumeFor(const LiveJob& job, const checkpoint::Committed& from, int slot) {
  // Every replica of stage j loads stage j's one shard (replicas are equal);
  // on another cut (recovery.min_stages), every shard that holds some of
  // stage j's blocks.
  const v1::CheckpointManifest& m = from.manifest;
  const int j = slot % NumStages(job);
  const auto [begin, end] = job.cut.ranges[static_cast<size_t>(j)];
  v1::ResumePoint r;
  r.set_step(m.step());
  r.set_phase(m.phase());
  r.set_phase_step(m.phase_step());
  if (m.shards_size() == NumStages(job) && m.shards(j).block_begin() == begin &&
      m.shards(j).block_end() == end) {
    const v1::CheckpointShard& shard = m.shards(j);
    r.set_shard_path(from.dir + "/" + shard.file());
    r.set_shard_bytes(shard.bytes());
    r.set_shard_crc32(shard.crc32());
    return r;
  }
  for (const v1::CheckpointShard& shard : m.shards()) {
    if (shard.block_end() <= begin || shard.block_begin() >= end) continue;
    v1::ResumeShard* source = r.add_sources();
    source->set_path(from.dir + "/" + shard.file());
    source->set_bytes(shard.bytes());
    source->set_crc32(shard.crc32());
    source->set_stage(shard.stage());
    source->set_block_begin(shard.block_begin());
    source->set_block_end(shard.block_end());
  }
  return r;
}

std::vector<std::string> SlotWorkers(const LiveJob& job, const std::vector<std::string>& claimed) {
  const size_t v = static_cast<size_t>(ChunksPerWorker(job));
  if (v == 1) return claimed;
  const size_t S = static_cast<size_t>(NumStages(job));
  const size_t J = static_cast<size_t>(NumWorkerStages(job));
  const size_t R = claimed.size() / J;
  std::vector<std::string> slots;
  slots.reserve(R * S);
  for (size_t r = 0; r < R; ++r) {
    for (size_t s = 0; s < S; ++s) slots.push_back(claimed[r * J + s % J]);
  }
  return slots;
}

std::vector<std::string> DistinctWorkers(const LiveJob& job) {
  std::vector<std::string> out;
  for (const std::string& w : job.attempt.workers) {
    if (std::find(out.begin(), out.end(), w) == out.end()) out.push_back(w);
  }
  return out;
}

absl::Duration StallLimit(const LiveJob& job) {
  if (job.spec.recovery.stall_seconds > 0) return absl::Seconds(job.spec.recovery.stall_seconds);
  return absl::Seconds(std::max(300.0, 20 * job.median_step_seconds));
}

absl::Time StallDeadline(const LiveJob& job) {
  if (job.status.state() != v1::RUNNING || job.attempt.progressed == absl::InfiniteFuture()) {
    return absl::InfiniteFuture();
  }
  return job.attempt.progressed + StallLimit(job);
}

void NoteProgress(LiveJob& job, int64_t step, absl::Time now) {
  if (job.attempt.progressed == absl::InfiniteFuture()) return;  // not running
  if (step >= 0) {
    if (step <= job.attempt.progressed_step) return;  // not a new step
    const double seconds = absl::ToDoubleSeconds(now - job.attempt.progressed) /
                           static_cast<double>(step - job.attempt.progressed_step);
    job.step_seconds.push_back(seconds);
    if (job.step_seconds.size() > LiveJob::kStepSamples) job.step_seconds.pop_front();
    std::vector<double> sorted(job.step_seconds.begin(), job.step_seconds.end());
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    job.median_step_seconds = sorted[sorted.size() / 2];
    job.attempt.progressed_step = step;
  }
  job.attempt.progressed = now;
}

std::vector<MetricPoint> ApplyMetrics(LiveJob& job, int stage, const v1::MetricsReport& m,
                                      absl::Time now) {
  std::vector<MetricPoint> points;
  if (job.attempt.workers.empty()) return points;
  v1::JobStatus& st = job.status;
  const int64_t now_ms = absl::ToUnixMillis(now);
  const bool last_stage = stage == NumStages(job) - 1;
  if (last_stage && m.values().count("train_loss")) {
    NoteProgress(job, m.step(), now);
    st.set_step(m.step());
    job.max_step = std::max(job.max_step, m.step());
    if (st.attempts_size() > 0) {
      st.mutable_attempts(st.attempts_size() - 1)->set_reached_step(m.step());
    }
    st.set_epoch(static_cast<int>(m.step() / data::StepsPerEpoch(job.spec).value_or(1)));
    st.set_train_loss(m.values().at("train_loss"));
    const double seconds = absl::ToDoubleSeconds(now - job.attempt.started);
    if (seconds > 0) {
      const int64_t from = job.resume ? job.resume->manifest.step() : 0;
      st.set_samples_per_second(static_cast<double>((m.step() - from) * job.spec.batch_size) /
                                seconds);
    }
    ApplyReplicaMetrics(job, stage, 0, m, now);
    points.push_back({m.step(), "train_loss", st.train_loss(), now_ms});
    points.push_back({m.step(), "samples_per_second", st.samples_per_second(), now_ms});
  }
  if (last_stage && m.values().count("eval_accuracy")) {
    // One evaluation per step is progress: a repeated report is not.
    if (m.step() > job.attempt.evaluated_step) {
      NoteProgress(job, -1, now);
      job.attempt.evaluated_step = m.step();
    }
    st.set_eval_loss(m.values().count("eval_loss") ? m.values().at("eval_loss") : 0.0);
    st.set_eval_accuracy(m.values().at("eval_accuracy"));
    points.push_back({m.step(), "eval_loss", st.eval_loss(), now_ms});
    points.push_back({m.step(), "eval_accuracy", st.eval_accuracy(), now_ms});
  }
  return points;
}

std::string SetPlacedReplicas(LiveJob& job) {
  const int J = std::max(1, NumStages(job));
  job.attempt.replicas = std::max(1, static_cast<int>(job.attempt.workers.size()) / J);
  job.status.set_num_replicas(job.attempt.replicas);
  job.status.clear_replica_samples_per_second();
  if (job.attempt.replicas >= SpecReplicas(job)) return "";
  return absl::StrCat("recovery.elastic: this attempt runs ", job.attempt.replicas, " of ",
                      SpecReplicas(job), " replicas of every stage (", job.attempt.workers.size(),
                      " workers were idle); the global batch stays ", job.spec.batch_size, ", ",
                      job.spec.batch_size / job.attempt.replicas, " per replica");
}

void ApplyReplicaMetrics(LiveJob& job, int stage, int replica, const v1::MetricsReport& m,
                         absl::Time now) {
  const int R = NumReplicas(job);
  if (R <= 1 || replica < 0 || replica >= R || stage != NumStages(job) - 1 ||
      !m.values().count("train_loss")) {
    return;
  }
  const double seconds = absl::ToDoubleSeconds(now - job.attempt.started);
  if (seconds <= 0) return;
  const int64_t from = job.resume ? job.resume->manifest.step() : 0;
  auto* rates = job.status.mutable_replica_samples_per_second();
  while (rates->size() < R) rates->Add(0.0);
  rates->Set(replica, static_cast<double>((m.step() - from) * (job.spec.batch_size / R)) / seconds);
}

std::vector<MetricPoint> ApplyResult(LiveJob& job, int stage, const v1::StageResult& result,
                                     absl::Time now) {
  std::vector<MetricPoint> points;
  for (const auto& [key, value] : result.values()) {
    const std::string name = absl::StrCat("stage", stage, ".", key);
    (*job.status.mutable_summary())[name] = value;
    points.push_back({job.status.step(), name, value, absl::ToUnixMillis(now)});
  }
  return points;
}

absl::StatusOr<LiveJob> RestoreLiveJob(const JobRecord& record) {
  STAGEWISE_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(record.spec_yaml));
  Submission submission;
  submission.spec = std::move(spec);
  STAGEWISE_ASSIGN_OR_RETURN(submission.blocks, models::PlanModel(submission.spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(submission.cut.ranges,
                             models::ResolvePartition(submission.spec.stages, submission.blocks));
  LiveJob job = MakeLiveJob(record.status, submission, record.spec_yaml);
  job.used = ReadUse(record.status.summary());
  job.attempt_number = record.status.attempt();
  for (const v1::JobAttempt& a : record.status.attempts()) {
    job.max_step = std::max(job.max_step, a.reached_step());
  }
  job.max_step = std::max(job.max_step, record.status.step());
  return job;
}

}  // namespace stagewise::coordinator
