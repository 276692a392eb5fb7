// services/render: the one drawing of timelines and charts that the CLI's
// files and the status pages share.
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/cli/timeline.h"
#include "coordinator/status_page.h"
#include "services/render/svg.h"
#include "services/render/timeline.h"

namespace stagewise::render {
namespace {

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

v1::Span MakeSpan(v1::SpanKind kind, int64_t start, int64_t duration, int64_t step, int mb = 0) {
  v1::Span s;
  s.set_kind(kind);
  s.set_start_us(start);
  s.set_duration_us(duration);
  s.set_step(step);
  s.set_micro_batch(mb);
  return s;
}

// Two stages of a micro-batched job, steps [first, last], one attempt.
v1::JobTrace TwoStages(int first, int last) {
  v1::JobTrace trace;
  trace.set_job_id("job-3");
  trace.set_name("tiny <gpt>");
  trace.set_algorithm("backprop");
  trace.set_num_stages(2);
  for (int stage = 0; stage < 2; ++stage) {
    v1::StageTrace* st = trace.add_stages();
    st->set_stage(stage);
    for (int step = first; step <= last; ++step) {
      const int64_t t = 1'000'000 + step * 10'000 + stage * 1'000;
      *st->add_spans() = MakeSpan(v1::SPAN_FORWARD, t, 2'000, step, 1);
      *st->add_spans() = MakeSpan(v1::SPAN_WAIT_NEXT, t + 2'000, 1'500, step, 1);
      *st->add_spans() = MakeSpan(v1::SPAN_BACKWARD, t + 3'500, 4'000, step, 1);
      *st->add_spans() = MakeSpan(v1::SPAN_STEP, t + 7'500, 500, step);
    }
  }
  return trace;
}

// What `stagewise trace --svg` draws from a saved trace and what the job page
// draws from the live one are the same SVG, byte for byte.
TEST(Render, TheCliAndTheStatusPageDrawTheSameTimeline) {
  const v1::JobTrace live = TwoStages(4, 6);
  auto saved = cli::ParseChromeTrace(cli::ChromeTraceJson(live), "t.json");
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::string from_file = cli::TimelineSvg(*saved);
  const std::string on_page = coordinator::status_page::TimelineSvg(live, 3, 60'000'000);
  EXPECT_EQ(from_file, on_page);
  EXPECT_EQ(Count(on_page, "class=\"span\""), 2 * 3 * 4);
}

TEST(Render, TheTimelineSaysWhichStepsItShowsAndNamesEveryColour) {
  const std::string svg = TimelineSvg(TwoStages(4, 6));
  EXPECT_TRUE(absl::StrContains(svg, "tiny &lt;gpt&gt; (backprop), mini-batches 4-6")) << svg;
  EXPECT_EQ(Count(svg, "class=\"legend\""), static_cast<int>(SpanStyles().size()));
  for (const SpanStyle& s : SpanStyles()) {
    EXPECT_TRUE(absl::StrContains(svg, absl::StrCat(">", s.legend, "</text>"))) << s.legend;
  }
  EXPECT_EQ(Count(svg, "<g class=\"track\""), 2);
  EXPECT_TRUE(absl::StrContains(svg, "box label: mini-batch.micro-batch"));
  EXPECT_TRUE(absl::StrContains(svg, "time (ms"));
}

// The page's window: the last steps of each stage's latest attempt, spans
// clipped to it.
TEST(Render, LastStepsKeepsTheLatestAttemptsLastSteps) {
  v1::JobTrace trace = TwoStages(0, 9);
  v1::JobTrace again = TwoStages(10, 19);
  for (v1::StageTrace& st : *again.mutable_stages()) {
    st.set_attempt(1);
    *trace.add_stages() = st;
  }
  const v1::JobTrace window = LastSteps(trace, 2, 60'000'000);
  ASSERT_EQ(window.stages_size(), 2);
  for (const v1::StageTrace& st : window.stages()) {
    EXPECT_EQ(st.attempt(), 1);
    for (const v1::Span& s : st.spans()) EXPECT_GE(s.step(), 18) << s.DebugString();
  }
  EXPECT_TRUE(absl::StrContains(TimelineSvg(window), "mini-batches 18-19"));
  // Capped at 500 us: only the tail of the last step's optimizer span.
  const v1::JobTrace capped = LastSteps(trace, 2, 500);
  int64_t covered = 0;
  for (const v1::StageTrace& st : capped.stages()) {
    for (const v1::Span& s : st.spans()) covered += s.duration_us();
  }
  EXPECT_EQ(covered, 500);
  EXPECT_TRUE(absl::StrContains(TimelineSvg(v1::JobTrace()), "no spans recorded"));
}

TEST(Render, ChartsHaveTicksWithValuesOnBothAxes) {
  std::map<std::string, std::vector<std::pair<double, double>>> series;
  for (int s = 0; s <= 100; s += 10) series["train_loss"].push_back({s, 2.0 - s / 100.0});
  ChartOptions options;
  options.y_label = "nats";
  const std::string svg = LineChartSvg("loss", series, options);
  // x from 0 to 100 in steps of 20, y from 1 to 2 in steps of 0.2 (or 0.5).
  for (const char* want : {">0</text>", ">20</text>", ">100</text>", ">1</text>", ">2</text>",
                           ">step</text>", ">nats</text>"}) {
    EXPECT_TRUE(absl::StrContains(svg, want)) << want << "\n" << svg;
  }
  EXPECT_GE(Count(svg, "class=\"tick\""), 8);
  EXPECT_TRUE(absl::StrContains(svg, "data-series=\"train_loss\" data-points=\"11\""));
}

TEST(Render, EscapingCoversTextAndAttributes) {
  EXPECT_EQ(XmlEscape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  EXPECT_EQ(TickLabel(0.1 + 0.2 - 0.3, 0.1), "0");
  EXPECT_EQ(TickStep(100, 5), 20);
  EXPECT_EQ(TickStep(0.9, 4), 0.5);
}

}  // namespace
}  // namespace stagewise::render
