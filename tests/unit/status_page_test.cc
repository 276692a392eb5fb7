// The coordinator's status pages (coordinator/status_page.h): what the HTML
// holds for given jobs, workers, metrics and traces.
#include "coordinator/status_page.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace stagewise::coordinator::status_page {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

v1::JobStatus Job(const std::string& id, v1::JobState state) {
  v1::JobStatus j;
  j.set_job_id(id);
  j.set_name("fmnist <mlp> & \"co\"");
  j.set_state(state);
  j.set_algorithm("petra");
  j.set_num_stages(4);
  j.set_step(250);
  j.set_total_steps(1000);
  j.set_samples_per_second(1234.6);
  j.set_eval_accuracy(0.875);
  j.set_eval_loss(0.4);
  j.set_owner("alice");
  return j;
}

TEST(StatusPage, EscapesEverythingItQuotes) {
  EXPECT_EQ(Escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  const std::string page = JobsPage({Job("job-1", v1::RUNNING)}, "", {});
  EXPECT_TRUE(absl::StrContains(page, "fmnist &lt;mlp&gt; &amp; &quot;co&quot;")) << page;
  EXPECT_FALSE(absl::StrContains(page, "<mlp>"));
}

TEST(StatusPage, TheJobsPageShowsTheQueueAndTheClustersGoodput) {
  std::vector<v1::JobStatus> jobs = {Job("run", v1::RUNNING), Job("second", v1::PENDING),
                                     Job("first", v1::RECOVERING), Job("held", v1::PENDING)};
  jobs[1].set_queue_position(2);
  jobs[1].set_priority("low");
  jobs[1].set_reason("class low: quota: <bob> holds 4 workers");
  jobs[2].set_queue_position(1);
  jobs[2].set_priority("high");
  jobs[3].set_suspended(true);
  v1::Goodput g;
  g.set_productive_worker_seconds(600);
  g.set_bubble_worker_seconds(100);
  g.set_startup_worker_seconds(50);
  g.set_idle_unqueued_worker_seconds(250);
  g.set_goodput(0.93);
  g.set_compute_share(0.857);
  const std::string page = JobsPage(jobs, "", {}, &g);
  // The queue: next first, the suspended one last, reasons escaped.
  const size_t first = page.find("<a href=\"/jobs/first\">");
  const size_t second = page.find("<a href=\"/jobs/second\">");
  const size_t held = page.find("<a href=\"/jobs/held\">");
  ASSERT_NE(page.find("id=\"queue\""), std::string::npos) << page;
  EXPECT_LT(first, second);
  EXPECT_LT(second, held);
  EXPECT_EQ(Count(page, "<tr class=\"waiting\">"), 3);
  EXPECT_TRUE(absl::StrContains(page, "quota: &lt;bob&gt; holds 4 workers"));
  EXPECT_TRUE(absl::StrContains(page, ">suspended<"));
  // Goodput: a bar with a rect per use in proportion (600 of 1000 s of 600 px).
  EXPECT_TRUE(absl::StrContains(page, "Goodput: 93.0%"));
  EXPECT_TRUE(absl::StrContains(page, "85.7% of the step time computed"));
  EXPECT_TRUE(
      absl::StrContains(page, "<rect data-use=\"productive\" x=\"0.0\" y=\"0\" width=\"360.0\""))
      << page;
  EXPECT_TRUE(absl::StrContains(page, "<rect data-use=\"idle_unqueued\" x=\"450.0\""));
  EXPECT_EQ(Count(page, "<rect data-use="), 7);
  // Without goodput or anything waiting: neither panel.
  const std::string plain = JobsPage({Job("run", v1::RUNNING)}, "", {});
  EXPECT_FALSE(absl::StrContains(plain, "id=\"goodput\""));
  EXPECT_FALSE(absl::StrContains(plain, "id=\"queue\""));
}

TEST(StatusPage, JobsPageHasARowPerJobWithProgressThroughputAndAccuracy) {
  std::vector<v1::JobStatus> jobs;
  for (int i = 0; i < 100; ++i) jobs.push_back(Job(absl::StrCat("job-", i), v1::RUNNING));
  jobs[3].set_state(v1::FAILED);
  jobs[3].set_reason("stage 1 failed");
  PageOptions o;
  o.refresh_seconds = 7;
  const std::string page = JobsPage(jobs, "tok en", o);
  EXPECT_EQ(Count(page, "<tr class=\"job\""), 100);
  EXPECT_TRUE(absl::StrContains(page, "id=\"job-job-42\""));
  EXPECT_TRUE(absl::StrContains(page, "<a href=\"/jobs/job-42\">job-42</a>"));
  EXPECT_TRUE(absl::StrContains(page, "<progress max=\"1000\" value=\"250\">"));
  EXPECT_TRUE(absl::StrContains(page, "1235 samples/s"));
  EXPECT_TRUE(absl::StrContains(page, "87.5%"));
  EXPECT_TRUE(absl::StrContains(page, "title=\"stage 1 failed\">FAILED"));
  // Why a job waits or failed is in the table itself, not only a tooltip.
  EXPECT_TRUE(absl::StrContains(page, "FAILED<div class=\"reason\">stage 1 failed</div>"));
  EXPECT_EQ(Count(page, "class=\"reason\""), 1);          // running jobs say nothing more
  EXPECT_TRUE(absl::StrContains(page, "content=\"7\""));  // the refresh
  EXPECT_TRUE(absl::StrContains(page, "href=\"/?page=tok en\""));
  EXPECT_FALSE(absl::StrContains(page, "<script"));
  EXPECT_FALSE(absl::StrContains(JobsPage({}, "", {}), "older jobs"));
}

TEST(StatusPage, TextJobsShowTokensAndBitsPerByte) {
  v1::JobStatus j = Job("job-t", v1::SUCCEEDED);
  j.set_tokens_per_sample(64);
  j.set_samples_per_second(100);
  j.set_eval_loss(0.6931471805599453);  // ln 2 nats: 1 bit per byte
  const std::string page = JobsPage({j}, "", {});
  EXPECT_TRUE(absl::StrContains(page, "6400 tokens/s")) << page;
  EXPECT_TRUE(absl::StrContains(page, "1 bits/byte"));
}

TEST(StatusPage, WorkersPageShowsStateJobStageHeartbeatAndPace) {
  std::vector<WorkerRow> rows(64);
  const absl::Time now = absl::FromUnixSeconds(1000000);
  for (int i = 0; i < 64; ++i) {
    rows[i].info.set_worker_id(absl::StrCat("w", i));
    (*rows[i].info.mutable_labels())["state"] = i < 4 ? "busy" : "idle";
    rows[i].last_seen = now - absl::Seconds(i);
  }
  (*rows[1].info.mutable_labels())["job"] = "job-9";
  (*rows[1].info.mutable_labels())["stage"] = "1";
  (*rows[1].info.mutable_labels())["replica"] = "0";
  rows[1].pace_over_plan = 1.25;
  rows[5].last_seen = absl::InfinitePast();
  rows[2].info.set_memory_bytes(int64_t{3} << 30);
  rows[2].info.set_version("0.1.0");
  (*rows[2].info.mutable_labels())["zone"] = "b<1>";
  (*rows[2].info.mutable_labels())["gpu"] = "h200";
  PageOptions o;
  o.now = now;
  const std::string page = WorkersPage(rows, o);
  EXPECT_EQ(Count(page, "<tr class=\"worker\""), 64);
  EXPECT_TRUE(absl::StrContains(page, "Workers (64)"));
  EXPECT_TRUE(absl::StrContains(page, "<a href=\"/jobs/job-9\">job-9</a>"));
  EXPECT_TRUE(absl::StrContains(page, "1 (replica 0)"));
  EXPECT_TRUE(absl::StrContains(page, "1.25x"));
  EXPECT_TRUE(absl::StrContains(page, "3 s ago"));
  EXPECT_TRUE(absl::StrContains(page, "never"));
  // Memory, version and the labels placement matches (escaped, sorted).
  EXPECT_TRUE(
      absl::StrContains(page, "3.0 GiB</td><td>0.1.0</td><td>gpu=h200 zone=b&lt;1&gt;</td>"))
      << page;
}

TEST(StatusPage, CurvesHaveAPointPerSampleAndSayWhenThereAreNone) {
  std::map<std::string, std::vector<std::pair<double, double>>> series;
  for (int s = 0; s < 10; ++s) series["train_loss"].push_back({s * 10.0, 2.0 / (s + 1)});
  series["eval_loss"] = {{50, 0.7}};
  const std::string svg = CurveSvg("loss", series, "nats");
  EXPECT_TRUE(absl::StrContains(svg, "data-series=\"train_loss\" data-points=\"10\"")) << svg;
  EXPECT_TRUE(absl::StrContains(svg, "data-series=\"eval_loss\" data-points=\"1\""));
  EXPECT_EQ(Count(svg, "<circle"), 1);  // the lone evaluation is a dot
  // The first loss (2.0, the highest) is at the top of the plot, the last at the bottom.
  EXPECT_TRUE(absl::StrContains(svg, "points=\"56.0,22.0 ")) << svg;
  EXPECT_TRUE(absl::StrContains(CurveSvg("accuracy", {}, ""), "no samples yet"));
}

v1::Span MakeSpan(v1::SpanKind kind, int64_t start, int64_t duration, int64_t step) {
  v1::Span s;
  s.set_kind(kind);
  s.set_start_us(start);
  s.set_duration_us(duration);
  s.set_step(step);
  return s;
}

TEST(StatusPage, TimelineHasATrackPerStageOfTheLatestAttemptAndLoadsAddUp) {
  v1::JobTrace trace;
  for (int stage = 0; stage < 3; ++stage) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      v1::StageTrace* st = trace.add_stages();
      st->set_stage(stage);
      st->set_attempt(attempt);
      const int64_t base = attempt * 1'000'000;  // attempt 1 runs a second later
      for (int step = 0; step < 10; ++step) {
        const int64_t t = base + step * 1000;
        *st->add_spans() = MakeSpan(v1::SPAN_FORWARD, t, 300, step);
        *st->add_spans() = MakeSpan(v1::SPAN_WAIT_NEXT, t + 300, 200, step);
        *st->add_spans() = MakeSpan(v1::SPAN_BACKWARD, t + 500, 500, step);
      }
    }
  }
  const std::string svg = TimelineSvg(trace, 3, 60'000'000);
  EXPECT_EQ(Count(svg, "<g class=\"track\""), 3);
  for (int stage = 0; stage < 3; ++stage) {
    EXPECT_TRUE(absl::StrContains(svg, absl::StrCat("data-stage=\"", stage, "\"")));
  }
  // The last 3 steps of attempt 1 on 3 stages: 9 spans each of 3 kinds.
  EXPECT_EQ(Count(svg, "class=\"span\""), 27) << svg;
  EXPECT_TRUE(absl::StrContains(svg, "backward, mini-batch 9:"));
  EXPECT_FALSE(absl::StrContains(svg, "mini-batch 6:"));
  EXPECT_TRUE(absl::StrContains(svg, "mini-batches 7-9"));

  const std::vector<StageLoad> loads = StageLoads(trace, 3, 60'000'000);
  ASSERT_EQ(loads.size(), 3u);
  for (const StageLoad& l : loads) {
    EXPECT_NEAR(l.busy, 0.8, 1e-9);
    EXPECT_NEAR(l.wait, 0.2, 1e-9);
  }
  // Capped windows cut spans at the window's start.
  const std::vector<StageLoad> capped = StageLoads(trace, 3, 500);
  EXPECT_NEAR(capped[0].busy, 1.0, 1e-9);  // only the last backward's 500 us
  EXPECT_TRUE(absl::StrContains(TimelineSvg(v1::JobTrace(), 3, 1000), "no spans recorded"));
}

TEST(StatusPage, JobPageShowsEverySectionOrItsError) {
  JobPageData d;
  d.job = Job("job-7", v1::RUNNING);
  for (int s = 1; s <= 5; ++s) {
    v1::MetricSample* m = d.metrics.add_samples();
    m->set_name("eval_accuracy");
    m->set_step(s * 10);
    m->set_value(0.1 * s);
  }
  for (int i = 0; i < 150; ++i) {
    v1::JobLogEvent* e = d.events.add_events();
    e->set_from_state(v1::RUNNING);
    e->set_to_state(v1::RUNNING);
    e->set_reason(absl::StrCat("checkpoint at step ", i, " committed"));
  }
  d.trace_error = "no trace <here>";
  v1::CheckpointInfo* c = d.checkpoints.add_checkpoints();
  c->set_step(100);
  c->set_num_shards(4);
  d.checkpoints.set_dir("/ckpt/job-7");
  const std::string page = JobPage(d, {});
  EXPECT_TRUE(absl::StrContains(page, "data-series=\"eval_accuracy\" data-points=\"5\""));
  EXPECT_TRUE(absl::StrContains(page, "no trace &lt;here&gt;"));
  EXPECT_TRUE(absl::StrContains(page, "The last 100 of 150 events"));
  EXPECT_FALSE(absl::StrContains(page, "checkpoint at step 49 committed"));
  EXPECT_TRUE(absl::StrContains(page, "checkpoint at step 50 committed"));
  EXPECT_TRUE(absl::StrContains(page, "id=\"checkpoints\""));
  EXPECT_TRUE(absl::StrContains(page, "/ckpt/job-7"));
  EXPECT_FALSE(absl::StrContains(page, "id=\"load\""));  // no trace, no loads
}

TEST(StatusPage, ErrorAndLoginPagesDoNotRefresh) {
  EXPECT_FALSE(absl::StrContains(ErrorPage(404, "no job x"), "refresh"));
  EXPECT_TRUE(absl::StrContains(ErrorPage(404, "no <job>"), "no &lt;job&gt;"));
  const std::string login = LoginPage("unknown token");
  EXPECT_TRUE(absl::StrContains(login, "action=\"/login\""));
  EXPECT_TRUE(absl::StrContains(login, "unknown token"));
  EXPECT_FALSE(absl::StrContains(login, "refresh"));
}

}  // namespace
}  // namespace stagewise::coordinator::status_page
