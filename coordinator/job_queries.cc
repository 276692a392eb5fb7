#include "coordinator/job_queries.h"

#include <algorithm>
#include <map>
#include <utility>

#include "services/checkpoint/checkpoint.h"
#include "services/common/status_macros.h"
#include "services/spec/job_spec.h"

namespace stagewise::coordinator {

absl::StatusOr<v1::JobStatus> JobQueries::GetJob(const std::string& job_id) const {
  if (std::optional<v1::JobStatus> live = view_->Find(job_id)) return *std::move(live);
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  return rec.status;
}

absl::StatusOr<std::vector<v1::JobStatus>> JobQueries::ListJobs(int limit) const {
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<v1::JobStatus> jobs, store_->ListJobs(limit));
  // Live jobs' progress may be newer than its last batched write.
  view_->Overlay(&jobs);
  return jobs;
}

absl::StatusOr<JobStore::JobPage> JobQueries::ListJobsPage(int page_size,
                                                           const std::string& page_token,
                                                           size_t max_bytes) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobStore::JobPage page,
                             store_->ListJobsPage(page_size, page_token, max_bytes));
  view_->Overlay(&page.jobs);
  return page;
}

absl::StatusOr<v1::ListCheckpointsResponse> JobQueries::ListCheckpoints(
    const std::string& job_id) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  STAGEWISE_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(rec.spec_yaml));
  v1::ListCheckpointsResponse out;
  if (spec.checkpoint.dir.empty()) return out;
  out.set_dir(checkpoint::JobDir(spec.checkpoint.dir, job_id));
  std::vector<std::string> skipped;
  for (const checkpoint::Committed& c :
       checkpoint::ListCommitted(spec.checkpoint.dir, job_id, false, &skipped)) {
    v1::CheckpointInfo* info = out.add_checkpoints();
    info->set_step(c.manifest.step());
    info->set_phase(c.manifest.phase());
    info->set_created_unix_ms(c.manifest.created_unix_ms());
    info->set_bytes(c.bytes);
    info->set_manifest_path(c.dir + "/" + checkpoint::kManifestName);
    info->set_num_shards(c.manifest.shards_size());
  }
  for (std::string& line : skipped) out.add_skipped(std::move(line));
  return out;
}

absl::StatusOr<v1::ListJobEventsResponse> JobQueries::JobEvents(const std::string& job_id) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<TransitionRecord> log,
                             store_->Transitions(job_id, /*notes=*/true));
  v1::ListJobEventsResponse out;
  v1::JobLogEvent* submitted = out.add_events();
  submitted->set_to_state(v1::PENDING);
  submitted->set_reason("submitted");
  submitted->set_unix_ms(rec.status.created_unix_ms());
  for (const TransitionRecord& t : log) {
    v1::JobLogEvent* e = out.add_events();
    e->set_from_state(t.from);
    e->set_to_state(t.to);
    e->set_reason(t.reason);
    e->set_unix_ms(t.unix_ms);
  }
  return out;
}

absl::StatusOr<v1::JobMetrics> JobQueries::JobMetrics(const std::string& job_id,
                                                      const std::vector<std::string>& names,
                                                      int max_points) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  (void)rec;
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<MetricPoint> points, store_->Metrics(job_id));
  const size_t cap = max_points > 0 ? static_cast<size_t>(max_points) : 5000;
  std::map<std::string, std::vector<const MetricPoint*>> by_name;
  for (const MetricPoint& p : points) {
    if (!names.empty() && std::find(names.begin(), names.end(), p.name) == names.end()) continue;
    by_name[p.name].push_back(&p);
  }
  v1::JobMetrics out;
  out.set_job_id(job_id);
  for (const auto& [name, series] : by_name) {
    const size_t n = series.size();
    for (size_t k = 0; k < std::min(n, cap); ++k) {
      // Evenly spaced indices from the first to the last point.
      const size_t i = n <= cap ? k : (cap == 1 ? n - 1 : k * (n - 1) / (cap - 1));
      v1::MetricSample* s = out.add_samples();
      s->set_step(series[i]->step);
      s->set_name(name);
      s->set_value(series[i]->value);
      s->set_unix_ms(series[i]->unix_ms);
    }
  }
  return out;
}

absl::StatusOr<v1::JobTrace> JobQueries::JobTrace(const std::string& job_id) const {
  STAGEWISE_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  STAGEWISE_ASSIGN_OR_RETURN(std::vector<v1::TraceChunk> chunks, store_->Trace(job_id));
  v1::JobTrace out;
  out.set_job_id(job_id);
  out.set_name(rec.status.name());
  out.set_algorithm(rec.status.algorithm());
  out.set_num_stages(rec.status.num_stages());
  out.set_chunks_per_worker(rec.status.chunks_per_worker());
  // Chunks of one stage and attempt go together, onto the coordinator's clock.
  std::map<std::pair<int, int>, v1::StageTrace> by_stage;
  for (const v1::TraceChunk& c : chunks) {
    const bool first = by_stage.count({c.stage(), c.attempt()}) == 0;
    v1::StageTrace& st = by_stage[{c.stage(), c.attempt()}];
    st.set_stage(c.stage());
    st.set_attempt(c.attempt());
    // -1: no estimate (offset 0) in some chunk.
    const bool unknown = st.clock_rtt_us() < 0 || c.clock_rtt_us() < 0;
    st.set_clock_rtt_us(first ? c.clock_rtt_us()
                              : (unknown ? -1 : std::max(st.clock_rtt_us(), c.clock_rtt_us())));
    st.set_dropped(std::max(st.dropped(), c.dropped()));
    out.set_dropped_at_coordinator(out.dropped_at_coordinator() + c.refused());
    for (const v1::Span& s : c.spans()) {
      v1::Span* span = st.add_spans();
      *span = s;
      span->set_start_us(s.start_us() + c.clock_offset_us());
    }
  }
  for (auto& [key, st] : by_stage) *out.add_stages() = std::move(st);
  return out;
}

}  // namespace stagewise::coordinator
