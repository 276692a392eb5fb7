// The coordinator's web status pages (docs/status_page.md), rendered on the
// server as HTML with inline SVG: no script, no external asset, so they work
// offline and in any browser. Pure functions of what the coordinator's
// queries return; web_server.cc serves them.
//
//   /                 jobs: state, algorithm, progress, throughput, accuracy
//   /workers          workers: state, job, stage, last heartbeat, pace
//   /jobs/<id>        one job: curves, timeline, busy/idle per stage, events,
//                     checkpoints
//
// Every page refreshes itself every `refresh_seconds` (meta refresh).
#ifndef STAGEWISE_COORDINATOR_STATUS_PAGE_H_
#define STAGEWISE_COORDINATOR_STATUS_PAGE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator::status_page {

struct PageOptions {
  int refresh_seconds = 5;  // 0: no refresh
  absl::Time now;           // for ages ("12 s ago")
};

// `s` with & < > " ' escaped for HTML text and attribute values.
std::string Escape(const std::string& s);

// The jobs table (newest first); `next_page` (a ListJobsPage token, "" for
// none) becomes an "older jobs" link. Above it the queue (QueuePanel, when
// a job waits) and, when given, the cluster's goodput (GoodputPanel).
std::string JobsPage(const std::vector<v1::JobStatus>& jobs, const std::string& next_page,
                     const PageOptions& options, const v1::Goodput* goodput = nullptr);

// The cluster's worker-seconds by use as a stacked bar (<svg
// class="goodput">, a <rect data-use="productive"> ... per use, widths in
// proportion) with a table of the figures (docs/operations.md, "Goodput").
std::string GoodputPanel(const v1::Goodput& goodput);
// The jobs waiting to be placed (PENDING or RECOVERING), next first: place,
// class, owner, workers and what each waits for (<table id="queue">); ""
// when none waits.
std::string QueuePanel(const std::vector<v1::JobStatus>& jobs);

// A worker as the page shows it: WorkerInfo (labels state, job, stage,
// replica from ListWorkers) and when the coordinator last heard from it.
struct WorkerRow {
  v1::WorkerInfo info;
  absl::Time last_seen = absl::InfinitePast();
  double pace_over_plan = 0;  // its stage's, from the job's summary; 0: unknown
};
std::string WorkersPage(const std::vector<WorkerRow>& workers, const PageOptions& options);

// Everything the job page shows; a section whose query failed shows its
// error instead (`*_error` non-empty).
struct JobPageData {
  v1::JobStatus job;
  v1::JobMetrics metrics;
  std::string metrics_error;
  v1::JobTrace trace;
  std::string trace_error;
  v1::ListJobEventsResponse events;
  std::string events_error;
  v1::ListCheckpointsResponse checkpoints;
  std::string checkpoints_error;
};
std::string JobPage(const JobPageData& data, const PageOptions& options);

// A line chart of one or more series (name -> (step, value) points, in
// order) as an <svg class="curve">; each series is a <polyline
// data-series="name"> with one point per sample (at most the samples given).
std::string CurveSvg(const std::string& title,
                     const std::map<std::string, std::vector<std::pair<double, double>>>& series,
                     const std::string& y_label);

// The last `steps` traced steps (at most `max_us`) of a trace as an
// <svg class="timeline">: one <g class="track" data-stage="j"> per stage (of
// its latest attempt), a <rect> per span coloured by kind.
std::string TimelineSvg(const v1::JobTrace& trace, int steps, int64_t max_us);

// Per stage over the same window: busy (every span but the receive waits)
// and waiting (the receive waits) as a share of the window; the rest is
// untraced time.
struct StageLoad {
  int stage = 0;
  double busy = 0;  // fraction of the window, 0..1
  double wait = 0;
};
std::vector<StageLoad> StageLoads(const v1::JobTrace& trace, int steps, int64_t max_us);

// A page that says why it cannot show what was asked (unknown job, a query
// that failed), with the HTTP status the server sends.
std::string ErrorPage(int http_status, const std::string& message);

// The login form (tokens are on): a token field posted to /login.
std::string LoginPage(const std::string& message);

}  // namespace stagewise::coordinator::status_page

#endif  // STAGEWISE_COORDINATOR_STATUS_PAGE_H_
