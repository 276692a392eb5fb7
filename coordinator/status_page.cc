#include "coordinator/status_page.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "services/render/svg.h"
#include "services/render/timeline.h"

namespace stagewise::coordinator::status_page {
namespace {

constexpr char kStyle[] = R"(
body{font:14px system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
nav{background:#263238;color:#fff;padding:8px 16px}nav a{color:#fff;margin-right:16px}
main{padding:12px 16px}h1{font-size:20px}h2{font-size:16px;margin-top:24px}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#eceff1}td.n{text-align:right;font-variant-numeric:tabular-nums}
.RUNNING{color:#1565c0}.SUCCEEDED{color:#2e7d32}.FAILED{color:#c62828}.CANCELLED{color:#757575}
.PENDING,.RECOVERING{color:#ef6c00}.err{color:#c62828}.bar{background:#eceff1;width:120px;height:10px}
.bar span{display:block;height:10px;background:#1565c0}svg{background:#fff;border:1px solid #ddd}
svg.timeline{max-width:100%;height:auto}
.reason{font-size:12px;color:#555;max-width:360px;white-space:normal}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}
)";

// Goodput's uses, in the bar's order, with their colours.
struct Use {
  const char* name;
  const char* label;
  const char* colour;
  double (v1::Goodput::*seconds)() const;
};
constexpr Use kUses[] = {
    {"productive", "productive", "#2e7d32", &v1::Goodput::productive_worker_seconds},
    {"bubble", "bubble (waiting for neighbours)", "#81c784", &v1::Goodput::bubble_worker_seconds},
    {"startup", "startup and placement", "#1565c0", &v1::Goodput::startup_worker_seconds},
    {"checkpoint", "checkpoint", "#6a1b9a", &v1::Goodput::checkpoint_worker_seconds},
    {"recovery", "recovery and redone steps", "#c62828", &v1::Goodput::recovery_worker_seconds},
    {"idle_waiting", "idle while jobs waited", "#ef6c00",
     &v1::Goodput::idle_waiting_worker_seconds},
    {"idle_unqueued", "idle, nothing queued", "#cfd8dc",
     &v1::Goodput::idle_unqueued_worker_seconds},
};

std::string Head(const std::string& title, const PageOptions& options) {
  std::string refresh =
      options.refresh_seconds > 0
          ? absl::StrCat("<meta http-equiv=\"refresh\" content=\"", options.refresh_seconds, "\">")
          : "";
  return absl::StrCat("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">", refresh,
                      "<title>", Escape(title), " · stagewise</title><style>", kStyle,
                      "</style></head><body><nav><b>stagewise</b> &nbsp; <a href=\"/\">Jobs</a>"
                      "<a href=\"/workers\">Workers</a></nav><main>");
}

constexpr char kTail[] = "</main></body></html>\n";

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  return name.empty() ? absl::StrCat(static_cast<int>(state)) : name;
}

std::string Number(double v, int digits = 3) {
  if (!std::isfinite(v)) return "—";
  return absl::StrFormat("%.*g", digits, v);
}

std::string Age(absl::Time then, absl::Time now) {
  if (then == absl::InfinitePast()) return "never";
  const double s = absl::ToDoubleSeconds(now - then);
  if (s < 120) return absl::StrFormat("%.0f s ago", std::max(0.0, s));
  if (s < 7200) return absl::StrFormat("%.0f min ago", s / 60);
  return absl::StrFormat("%.1f h ago", s / 3600);
}

std::string When(int64_t unix_ms) {
  if (unix_ms <= 0) return "—";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string JobLink(const std::string& id) {
  return absl::StrCat("<a href=\"/jobs/", Escape(id), "\">", Escape(id), "</a>");
}

std::string Throughput(const v1::JobStatus& j) {
  if (j.samples_per_second() <= 0) return "—";
  if (j.tokens_per_sample() > 0) {
    return absl::StrCat(Number(j.samples_per_second() * j.tokens_per_sample(), 4), " tokens/s");
  }
  return absl::StrCat(Number(j.samples_per_second(), 4), " samples/s");
}

std::string Accuracy(const v1::JobStatus& j) {
  if (j.eval_accuracy() <= 0 && j.eval_loss() <= 0) return "—";
  if (j.tokens_per_sample() > 0) {
    return absl::StrCat(Number(j.eval_loss() / std::log(2.0)), " bits/byte");
  }
  return absl::StrFormat("%.1f%%", 100 * j.eval_accuracy());
}

// Under the state of a job that waits, recovers or ended badly, why (in the
// cell, not only as a tooltip: "waiting for 2 idle workers ...").
std::string StateReason(const v1::JobStatus& j) {
  const bool says_why = j.state() == v1::PENDING || j.state() == v1::RECOVERING ||
                        j.state() == v1::FAILED || j.state() == v1::CANCELLED;
  if (!says_why || j.reason().empty()) return "";
  return absl::StrCat("<div class=\"reason\">", Escape(j.reason()), "</div>");
}

std::string Memory(int64_t bytes) {
  if (bytes <= 0) return "—";
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

// A worker's labels besides the ones with their own column (state, job,
// stage, replica): key=value, sorted.
std::string OtherLabels(const google::protobuf::Map<std::string, std::string>& labels) {
  std::map<std::string, std::string> sorted(labels.begin(), labels.end());
  std::vector<std::string> parts;
  for (const auto& [key, value] : sorted) {
    if (key == "state" || key == "job" || key == "stage" || key == "replica") continue;
    parts.push_back(Escape(absl::StrCat(key, "=", value)));
  }
  return parts.empty() ? "—" : absl::StrJoin(parts, " ");
}

std::string Progress(const v1::JobStatus& j) {
  const int64_t total = std::max<int64_t>(j.total_steps(), 1);
  return absl::StrCat("<progress max=\"", total, "\" value=\"", std::min(j.step(), total),
                      "\"></progress> ", j.step(), " / ", j.total_steps());
}

}  // namespace

std::string Escape(const std::string& s) { return render::XmlEscape(s); }

std::string GoodputPanel(const v1::Goodput& g) {
  double total = 0;
  for (const Use& u : kUses) total += std::max(0.0, (g.*u.seconds)());
  constexpr int kWidth = 600;
  std::string bar =
      absl::StrCat("<svg class=\"goodput\" width=\"", kWidth,
                   "\" height=\"22\" role=\"img\" aria-label=\"worker-seconds by use\">");
  std::string rows;
  double x = 0;
  for (const Use& u : kUses) {
    const double seconds = std::max(0.0, (g.*u.seconds)());
    const double width = total > 0 ? kWidth * seconds / total : 0;
    absl::StrAppend(&bar, "<rect data-use=\"", u.name, "\" x=\"", absl::StrFormat("%.1f", x),
                    "\" y=\"0\" width=\"", absl::StrFormat("%.1f", width),
                    "\" height=\"22\" fill=\"", u.colour, "\"><title>", u.label, "</title></rect>");
    x += width;
    absl::StrAppend(
        &rows, "<tr><td><span class=\"swatch\" style=\"background:", u.colour, "\"></span>",
        u.label, "</td><td class=\"n\">", absl::StrFormat("%.1f", seconds), "</td><td class=\"n\">",
        total > 0 ? absl::StrFormat("%.1f%%", 100 * seconds / total) : "—", "</td></tr>");
  }
  absl::StrAppend(&bar, "</svg>");
  return absl::StrCat(
      "<section id=\"goodput\"><h2>Goodput: ", absl::StrFormat("%.1f%%", 100 * g.goodput()),
      " <small>of the time there was work went into training steps; ",
      absl::StrFormat("%.1f%%", 100 * g.compute_share()), " of the step time computed</small></h2>",
      bar, "<table id=\"goodput-uses\"><tr><th>use</th><th>worker-seconds</th><th>share</th></tr>",
      rows, "</table></section>");
}

std::string QueuePanel(const std::vector<v1::JobStatus>& jobs) {
  std::vector<const v1::JobStatus*> waiting;
  for (const v1::JobStatus& j : jobs) {
    if (j.state() == v1::PENDING || j.state() == v1::RECOVERING) waiting.push_back(&j);
  }
  if (waiting.empty()) return "";
  std::stable_sort(waiting.begin(), waiting.end(), [](const auto* a, const auto* b) {
    const int pa = a->queue_position() > 0 ? a->queue_position() : 1 << 30;
    const int pb = b->queue_position() > 0 ? b->queue_position() : 1 << 30;
    return pa < pb;
  });
  std::string out =
      "<h2>Queue</h2><table id=\"queue\"><tr><th>place</th><th>job</th><th>class</th>"
      "<th>owner</th><th>workers</th><th>waits for</th></tr>";
  for (const v1::JobStatus* j : waiting) {
    const int workers = std::max(1, j->num_stages()) * std::max(1, j->num_replicas()) /
                        std::max(1, j->chunks_per_worker());
    absl::StrAppend(&out, "<tr class=\"waiting\"><td class=\"n\">",
                    j->queue_position() > 0 ? absl::StrCat(j->queue_position())
                    : j->suspended()        ? "suspended"
                                            : "—",
                    "</td><td>", JobLink(j->job_id()), "</td><td>",
                    j->priority().empty() ? "—" : Escape(j->priority()), "</td><td>",
                    j->owner().empty() ? "—" : Escape(j->owner()), "</td><td class=\"n\">", workers,
                    "</td><td class=\"reason\">", Escape(j->reason()), "</td></tr>");
  }
  return out + "</table>";
}

std::string JobsPage(const std::vector<v1::JobStatus>& jobs, const std::string& next_page,
                     const PageOptions& options, const v1::Goodput* goodput) {
  std::string out = Head("Jobs", options);
  if (goodput != nullptr) absl::StrAppend(&out, GoodputPanel(*goodput));
  absl::StrAppend(&out, QueuePanel(jobs));
  absl::StrAppend(
      &out, "<h1>Jobs</h1><table id=\"jobs\"><tr><th>job</th><th>name</th>",
      "<th>state</th><th>algorithm</th><th>stages</th><th>progress</th>",
      "<th>throughput</th><th>accuracy</th><th>owner</th><th>submitted (UTC)</th></tr>");
  for (const v1::JobStatus& j : jobs) {
    const std::string state = StateName(j.state());
    absl::StrAppend(&out, "<tr class=\"job\" id=\"job-", Escape(j.job_id()), "\"><td>",
                    JobLink(j.job_id()), "</td><td>", Escape(j.name()), "</td><td class=\"", state,
                    "\" title=\"", Escape(j.reason()), "\">", state, StateReason(j), "</td><td>",
                    Escape(j.algorithm()), "</td><td class=\"n\">", j.num_stages(),
                    j.num_replicas() > 1 ? absl::StrCat(" × ", j.num_replicas()) : "", "</td><td>",
                    Progress(j), "</td><td class=\"n\">", Throughput(j), "</td><td class=\"n\">",
                    Accuracy(j), "</td><td>", Escape(j.owner()), "</td><td>",
                    When(j.created_unix_ms()), "</td></tr>");
  }
  absl::StrAppend(&out, "</table>");
  if (jobs.empty()) absl::StrAppend(&out, "<p>No jobs yet.</p>");
  if (!next_page.empty()) {
    absl::StrAppend(&out, "<p><a href=\"/?page=", Escape(next_page), "\">older jobs</a></p>");
  }
  return out + kTail;
}

std::string WorkersPage(const std::vector<WorkerRow>& workers, const PageOptions& options) {
  std::string out = Head("Workers", options);
  absl::StrAppend(&out, "<h1>Workers (", workers.size(), ")</h1><table id=\"workers\"><tr>",
                  "<th>worker</th><th>state</th><th>job</th><th>stage</th><th>device</th>",
                  "<th>memory</th><th>version</th><th>labels</th>",
                  "<th>address</th><th>last heartbeat</th><th>pace / plan</th></tr>");
  for (const WorkerRow& w : workers) {
    const auto& labels = w.info.labels();
    auto label = [&](const char* key) {
      auto it = labels.find(key);
      return it == labels.end() ? std::string() : it->second;
    };
    const std::string job = label("job");
    std::string stage = label("stage");
    if (!label("replica").empty()) absl::StrAppend(&stage, " (replica ", label("replica"), ")");
    absl::StrAppend(&out, "<tr class=\"worker\" id=\"worker-", Escape(w.info.worker_id()),
                    "\"><td>", Escape(w.info.worker_id()), "</td><td>", Escape(label("state")),
                    "</td><td>", job.empty() ? "—" : JobLink(job), "</td><td class=\"n\">",
                    stage.empty() ? "—" : Escape(stage), "</td><td>", Escape(w.info.device()),
                    "</td><td class=\"n\">", Memory(w.info.memory_bytes()), "</td><td>",
                    w.info.version().empty() ? "—" : Escape(w.info.version()), "</td><td>",
                    OtherLabels(labels), "</td><td>", Escape(w.info.address()), "</td><td>",
                    Age(w.last_seen, options.now), "</td><td class=\"n\">",
                    w.pace_over_plan > 0 ? absl::StrFormat("%.2fx", w.pace_over_plan) : "—",
                    "</td></tr>");
  }
  absl::StrAppend(&out, "</table>");
  return out + kTail;
}

std::string CurveSvg(const std::string& title,
                     const std::map<std::string, std::vector<std::pair<double, double>>>& series,
                     const std::string& y_label) {
  render::ChartOptions options;
  options.y_label = y_label;
  return render::LineChartSvg(title, series, options);
}

std::string TimelineSvg(const v1::JobTrace& trace, int steps, int64_t max_us) {
  return render::TimelineSvg(render::LastSteps(trace, steps, max_us));
}

std::vector<StageLoad> StageLoads(const v1::JobTrace& trace, int steps, int64_t max_us) {
  const v1::JobTrace window = render::LastSteps(trace, steps, max_us);
  int64_t begin = std::numeric_limits<int64_t>::max(), end = std::numeric_limits<int64_t>::min();
  for (const v1::StageTrace& st : window.stages()) {
    for (const v1::Span& s : st.spans()) {
      begin = std::min(begin, s.start_us());
      end = std::max(end, s.start_us() + s.duration_us());
    }
  }
  std::vector<StageLoad> out;
  if (end <= begin) return out;
  for (const v1::StageTrace& st : window.stages()) {
    StageLoad load;
    load.stage = st.stage();
    for (const v1::Span& s : st.spans()) {
      (render::IsWait(s.kind()) ? load.wait : load.busy) += static_cast<double>(s.duration_us());
    }
    load.busy = std::min(1.0, load.busy / static_cast<double>(end - begin));
    load.wait = std::min(1.0, load.wait / static_cast<double>(end - begin));
    out.push_back(load);
  }
  return out;
}

std::string JobPage(const JobPageData& d, const PageOptions& options) {
  const v1::JobStatus& j = d.job;
  const std::string state = StateName(j.state());
  std::string out = Head(absl::StrCat("Job ", j.job_id()), options);
  absl::StrAppend(&out, "<h1>Job ", Escape(j.job_id()), " · ", Escape(j.name()), "</h1>",
                  "<table id=\"summary\"><tr><th>state</th><td class=\"", state, "\">", state,
                  j.reason().empty() ? "" : absl::StrCat(": ", Escape(j.reason())), "</td></tr>",
                  "<tr><th>algorithm</th><td>", Escape(j.algorithm()), "</td></tr>",
                  "<tr><th>stages</th><td>", j.num_stages(),
                  j.num_replicas() > 1 ? absl::StrCat(" × ", j.num_replicas(), " replicas") : "",
                  "</td></tr><tr><th>progress</th><td>", Progress(j), "</td></tr>",
                  "<tr><th>throughput</th><td>", Throughput(j), "</td></tr>",
                  "<tr><th>accuracy</th><td>", Accuracy(j), "</td></tr>",
                  "<tr><th>train loss</th><td>", Number(j.train_loss()), "</td></tr>",
                  "<tr><th>attempt</th><td>", j.attempt(), "</td></tr>", "<tr><th>owner</th><td>",
                  Escape(j.owner()), "</td></tr></table>");

  absl::StrAppend(&out, "<h2>Curves</h2>");
  if (!d.metrics_error.empty()) {
    absl::StrAppend(&out, "<p class=\"err\">", Escape(d.metrics_error), "</p>");
  } else {
    std::map<std::string, std::vector<std::pair<double, double>>> by_name;
    for (const v1::MetricSample& s : d.metrics.samples()) {
      by_name[s.name()].emplace_back(static_cast<double>(s.step()), s.value());
    }
    auto pick = [&](std::initializer_list<const char*> names) {
      std::map<std::string, std::vector<std::pair<double, double>>> out;
      for (const char* n : names) {
        if (auto it = by_name.find(n); it != by_name.end()) out[n] = it->second;
      }
      return out;
    };
    absl::StrAppend(&out, "<div id=\"curves\">",
                    CurveSvg("loss", pick({"train_loss", "eval_loss"}), "nats"), " ",
                    CurveSvg("accuracy", pick({"eval_accuracy"}), "fraction"), " ",
                    CurveSvg("throughput", pick({"samples_per_second"}), "samples/s"), "</div>");
  }

  constexpr int kWindowSteps = 3;
  constexpr int64_t kMaxWindowUs = 60'000'000;
  absl::StrAppend(&out, "<h2>Timeline</h2>");
  if (!d.trace_error.empty()) {
    absl::StrAppend(&out, "<p class=\"err\">", Escape(d.trace_error), "</p>");
  } else {
    absl::StrAppend(&out, TimelineSvg(d.trace, kWindowSteps, kMaxWindowUs));
    const std::vector<StageLoad> loads = StageLoads(d.trace, kWindowSteps, kMaxWindowUs);
    if (!loads.empty()) {
      absl::StrAppend(&out, "<h2>Busy and idle per stage</h2><table id=\"load\"><tr>",
                      "<th>stage</th><th>busy</th><th></th><th>waiting</th></tr>");
      for (const StageLoad& l : loads) {
        absl::StrAppendFormat(&out,
                              "<tr><td class=\"n\">%d</td><td class=\"n\">%.0f%%</td><td><div "
                              "class=\"bar\"><span style=\"width:%.0f%%\"></span></div></td>"
                              "<td class=\"n\">%.0f%%</td></tr>",
                              l.stage, 100 * l.busy, 100 * l.busy, 100 * l.wait);
      }
      absl::StrAppend(&out, "</table>");
    }
  }

  absl::StrAppend(&out, "<h2>Events</h2>");
  if (!d.events_error.empty()) {
    absl::StrAppend(&out, "<p class=\"err\">", Escape(d.events_error), "</p>");
  } else {
    constexpr int kMaxEvents = 100;
    const int n = d.events.events_size();
    if (n > kMaxEvents) {
      absl::StrAppend(&out, "<p>The last ", kMaxEvents, " of ", n,
                      " events (<code>stagewise events ", Escape(j.job_id()),
                      "</code> lists them all).</p>");
    }
    absl::StrAppend(&out, "<table id=\"events\"><tr><th>time (UTC)</th><th>from</th><th>to</th>",
                    "<th>reason</th></tr>");
    for (int i = std::max(0, n - kMaxEvents); i < n; ++i) {
      const v1::JobLogEvent& e = d.events.events(i);
      absl::StrAppend(&out, "<tr><td>", When(e.unix_ms()), "</td><td>",
                      e.from_state() == v1::JOB_STATE_UNSPECIFIED ? "" : StateName(e.from_state()),
                      "</td><td>", StateName(e.to_state()), "</td><td>", Escape(e.reason()),
                      "</td></tr>");
    }
    absl::StrAppend(&out, "</table>");
  }

  absl::StrAppend(&out, "<h2>Checkpoints</h2>");
  if (!d.checkpoints_error.empty()) {
    absl::StrAppend(&out, "<p class=\"err\">", Escape(d.checkpoints_error), "</p>");
  } else if (d.checkpoints.checkpoints().empty()) {
    absl::StrAppend(&out, "<p>None", d.checkpoints.dir().empty() ? " (no checkpoint.dir)" : "",
                    ".</p>");
  } else {
    absl::StrAppend(&out, "<p>In ", Escape(d.checkpoints.dir()), "</p>",
                    "<table id=\"checkpoints\"><tr><th>step</th><th>written (UTC)</th>",
                    "<th>shards</th><th>bytes</th></tr>");
    for (const v1::CheckpointInfo& c : d.checkpoints.checkpoints()) {
      absl::StrAppend(&out, "<tr><td class=\"n\">", c.step(), "</td><td>",
                      When(c.created_unix_ms()), "</td><td class=\"n\">", c.num_shards(),
                      "</td><td class=\"n\">", c.bytes(), "</td></tr>");
    }
    absl::StrAppend(&out, "</table>");
  }
  return out + kTail;
}

std::string ErrorPage(int http_status, const std::string& message) {
  PageOptions options;
  options.refresh_seconds = 0;
  return absl::StrCat(Head("Error", options), "<h1>", http_status, "</h1><p class=\"err\">",
                      Escape(message), "</p>", kTail);
}

std::string LoginPage(const std::string& message) {
  PageOptions options;
  options.refresh_seconds = 0;
  return absl::StrCat(
      Head("Sign in", options), "<h1>Sign in</h1>",
      message.empty() ? "" : absl::StrCat("<p class=\"err\">", Escape(message), "</p>"),
      "<p>This coordinator asks for a token (a read token is enough).</p>",
      "<form method=\"post\" action=\"/login\"><input type=\"password\" name=\"token\" "
      "size=\"70\" autofocus> <button type=\"submit\">Sign in</button></form>",
      kTail);
}

}  // namespace stagewise::coordinator::status_page
