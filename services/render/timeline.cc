#include "services/render/timeline.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/render/svg.h"

namespace stagewise::render {
namespace {

// The mini-batches the training spans cover; {0, -1} for none.
std::pair<int64_t, int64_t> StepRange(const v1::JobTrace& trace) {
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const v1::StageTrace& st : trace.stages()) {
    for (const v1::Span& s : st.spans()) {
      if (s.kind() == v1::SPAN_EVAL || s.kind() == v1::SPAN_CHECKPOINT) continue;
      lo = std::min(lo, s.step());
      hi = std::max(hi, s.step());
    }
  }
  if (lo > hi) return {0, -1};
  return {lo, hi};
}

// The drawing's geometry: rows (a row per stage, or per worker when
// interleaved), the time scale and the legend's place.
struct Layout {
  static constexpr double kLeft = 78, kRight = 24, kTop = 46, kRow = 40, kGap = 10, kPlot = 1100;
  static constexpr int kLegendPerLine = 5;
  int64_t origin = 0;
  double span_ms = 1e-3;
  int workers = 1;
  bool by_worker = false;
  bool micro = false;  // some span has a micro-batch number
  double rows_bottom = 0, legend_top = 0, legend_lines = 0, width = 0, height = 0;

  explicit Layout(const v1::JobTrace& trace) {
    const auto [begin, end] = TraceExtent(trace);
    origin = begin;
    span_ms = std::max<double>(static_cast<double>(end - begin) / 1000.0, 1e-3);
    int stages = trace.num_stages();
    for (const v1::StageTrace& st : trace.stages()) stages = std::max(stages, st.stage() + 1);
    stages = std::max(stages, 1);
    // Interleaved: a row per worker, which holds stages w, w + workers, ...
    const int chunks = std::max(1, trace.chunks_per_worker());
    workers = chunks > 1 && stages % chunks == 0 ? stages / chunks : stages;
    by_worker = workers != stages;
    for (const v1::StageTrace& st : trace.stages()) {
      for (const v1::Span& s : st.spans()) micro = micro || s.micro_batch() > 0;
    }
    width = kLeft + kPlot + kRight;
    rows_bottom = kTop + workers * (kRow + kGap);
    legend_top = rows_bottom + 62;
    const int kinds = static_cast<int>(SpanStyles().size());
    legend_lines = (kinds + kLegendPerLine - 1) / kLegendPerLine;
    height = legend_top + legend_lines * 22 + 16;
  }
  double X(int64_t us) const {
    return kLeft + kPlot * (static_cast<double>(us - origin) / 1000.0) / span_ms;
  }
  int Row(int stage) const { return by_worker ? stage % workers : stage; }
};

void DrawAxis(const Layout& l, std::string* svg) {
  const double tick = TickStep(l.span_ms, 10);
  for (double t = 0; t <= l.span_ms + 1e-9; t += tick) {
    const double x = Layout::kLeft + Layout::kPlot * t / l.span_ms;
    absl::StrAppendFormat(
        svg,
        "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#e8e8e8\"/>\n"
        "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
        x, Layout::kTop - 6, x, l.rows_bottom, x, l.rows_bottom + 16, TickLabel(t, tick));
  }
  absl::StrAppendFormat(svg,
                        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\">time "
                        "(ms, coordinator clock, from the first span)</text>\n",
                        Layout::kLeft + Layout::kPlot / 2, l.rows_bottom + 34);
  for (int j = 0; j < l.workers; ++j) {
    const double y = Layout::kTop + j * (Layout::kRow + Layout::kGap);
    absl::StrAppendFormat(svg,
                          "<text x=\"%.0f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"end\">%s "
                          "%d</text>\n<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
                          "fill=\"none\" stroke=\"#d0d0d0\"/>\n",
                          Layout::kLeft - 8, y + Layout::kRow / 2 + 4,
                          l.by_worker ? "worker" : "stage", j, Layout::kLeft, y, Layout::kPlot,
                          Layout::kRow);
  }
}

void DrawTrack(const Layout& l, const v1::StageTrace& st, std::string* svg) {
  constexpr double kRow = Layout::kRow;
  const double y = Layout::kTop + l.Row(st.stage()) * (kRow + Layout::kGap);
  const int chunk = l.by_worker ? st.stage() / l.workers : 0;
  absl::StrAppendFormat(svg, "<g class=\"track\" data-stage=\"%d\" id=\"stage%d-attempt%d\">\n",
                        st.stage(), st.stage(), st.attempt());
  for (const v1::Span& s : st.spans()) {
    const SpanStyle* style = StyleOf(s.kind());
    if (style == nullptr) continue;
    const double x0 = l.X(s.start_us());
    const double w = std::max(0.4, l.X(s.start_us() + s.duration_us()) - x0);
    std::string label = absl::StrCat(s.step());
    if (l.micro) absl::StrAppend(&label, ".", s.micro_batch());
    if (l.by_worker) label = absl::StrCat("c", chunk, ":", label);
    if (s.kind() == v1::SPAN_EVAL) label = "eval";
    if (s.kind() == v1::SPAN_CHECKPOINT) label = "ckpt";
    const std::string tip = absl::StrFormat(
        "%s%s, mini-batch %d%s: %.3f ms", style->legend,
        l.by_worker ? absl::StrCat(" of chunk ", chunk, " (stage ", st.stage(), ")") : "", s.step(),
        l.micro ? absl::StrCat(", micro-batch ", s.micro_batch()) : "",
        static_cast<double>(s.duration_us()) / 1000.0);
    if (style->thin) {
      absl::StrAppendFormat(svg,
                            "<rect class=\"span\" data-kind=\"%s\" x=\"%.2f\" y=\"%.1f\" "
                            "width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>%s</title></rect>\n",
                            style->name, x0, y + kRow * 0.4, w, kRow * 0.2, style->colour,
                            XmlEscape(tip));
      continue;
    }
    // Odd mini-batches lighter, so neighbouring boxes of one kind part;
    // interleaved: odd chunks too.
    absl::StrAppendFormat(svg,
                          "<rect class=\"span\" data-kind=\"%s\" x=\"%.2f\" y=\"%.1f\" "
                          "width=\"%.2f\" height=\"%.1f\" fill=\"%s\" fill-opacity=\"%s\" "
                          "stroke=\"white\" stroke-width=\"0.5\"><title>%s</title></rect>\n",
                          style->name, x0, y + 2, w, kRow - 4, style->colour,
                          (s.step() + chunk) % 2 ? "0.7" : "1", XmlEscape(tip));
    const double chars = static_cast<double>(label.size());
    if (w >= chars * 5.6 + 2 && s.kind() != v1::SPAN_SEND) {
      absl::StrAppendFormat(svg,
                            "<text x=\"%.2f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\" "
                            "fill=\"white\">%s</text>\n",
                            x0 + w / 2, y + kRow / 2 + 3.5, label);
    }
  }
  *svg += "</g>\n";
}

void DrawLegend(const Layout& l, std::string* svg) {
  int i = 0;
  for (const SpanStyle& s : SpanStyles()) {
    const double x = Layout::kLeft + (i % Layout::kLegendPerLine) * 220;
    const double y = l.legend_top + (i / Layout::kLegendPerLine) * 22;
    absl::StrAppendFormat(svg,
                          "<rect class=\"legend\" x=\"%.0f\" y=\"%.0f\" width=\"22\" "
                          "height=\"%d\" fill=\"%s\"/>\n",
                          x, y - (s.thin ? 7 : 11), s.thin ? 4 : 12, s.colour);
    absl::StrAppendFormat(svg, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">%s</text>\n", x + 28,
                          y, s.legend);
    ++i;
  }
  absl::StrAppendFormat(svg,
                        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" fill=\"#555\">box label: "
                        "%smini-batch%s</text>\n",
                        Layout::kLeft, l.legend_top + l.legend_lines * 22 + 8,
                        l.by_worker ? "c&lt;chunk&gt;:" : "", l.micro ? ".micro-batch" : "");
}

}  // namespace

std::pair<int64_t, int64_t> TraceExtent(const v1::JobTrace& trace) {
  int64_t begin = INT64_MAX, end = INT64_MIN;
  for (const v1::StageTrace& st : trace.stages()) {
    for (const v1::Span& s : st.spans()) {
      begin = std::min(begin, s.start_us());
      end = std::max(end, s.start_us() + s.duration_us());
    }
  }
  if (begin > end) return {0, 0};
  return {begin, end};
}

std::string TraceTitle(const v1::JobTrace& trace) {
  std::string title = trace.name().empty() ? trace.job_id() : trace.name();
  if (!trace.algorithm().empty()) absl::StrAppend(&title, " (", trace.algorithm(), ")");
  const auto [lo, hi] = StepRange(trace);
  if (hi >= lo) absl::StrAppend(&title, ", mini-batches ", lo, "-", hi);
  return title;
}

std::string TimelineSvg(const v1::JobTrace& trace) {
  const Layout l(trace);
  bool any = false;
  for (const v1::StageTrace& st : trace.stages()) any = any || st.spans_size() > 0;
  const double height = any ? l.height : 60;
  std::string svg = absl::StrFormat(
      "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      l.width, height, l.width, height);
  absl::StrAppendFormat(
      &svg, "<text x=\"%.0f\" y=\"24\" font-size=\"16\" font-weight=\"bold\">%s</text>\n",
      Layout::kLeft, XmlEscape(TraceTitle(trace)));
  if (!any) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.0f\" y=\"46\" fill=\"#777\">no spans recorded (the job's "
                          "trace: section turns tracing on)</text>\n</svg>\n",
                          Layout::kLeft);
    return svg;
  }
  DrawAxis(l, &svg);
  for (const v1::StageTrace& st : trace.stages()) DrawTrack(l, st, &svg);
  DrawLegend(l, &svg);
  svg += "</svg>\n";
  return svg;
}

v1::JobTrace LastSteps(const v1::JobTrace& trace, int steps, int64_t max_us) {
  std::map<int, const v1::StageTrace*> latest;
  for (const v1::StageTrace& st : trace.stages()) {
    auto [it, fresh] = latest.emplace(st.stage(), &st);
    if (!fresh && st.attempt() >= it->second->attempt()) it->second = &st;
  }
  int64_t end = INT64_MIN, last_step = INT64_MIN;
  for (const auto& [stage, st] : latest) {
    for (const v1::Span& s : st->spans()) {
      end = std::max(end, s.start_us() + s.duration_us());
      last_step = std::max(last_step, s.step());
    }
  }
  v1::JobTrace out = trace;
  out.clear_stages();
  int64_t begin = end;
  for (const auto& [stage, st] : latest) {
    for (const v1::Span& s : st->spans()) {
      if (s.step() > last_step - steps) begin = std::min(begin, s.start_us());
    }
  }
  if (end != INT64_MIN) begin = std::max(begin, end - max_us);
  for (const auto& [stage, st] : latest) {
    v1::StageTrace* kept = out.add_stages();
    *kept = *st;
    kept->clear_spans();
    for (const v1::Span& s : st->spans()) {
      const int64_t a = std::max(s.start_us(), begin);
      const int64_t b = std::min(s.start_us() + s.duration_us(), end);
      if (b <= a) continue;
      v1::Span* c = kept->add_spans();
      *c = s;
      c->set_start_us(a);
      c->set_duration_us(b - a);
    }
  }
  return out;
}

}  // namespace stagewise::render
