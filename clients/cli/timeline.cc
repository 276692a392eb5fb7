#include "clients/cli/timeline.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/format.h"

namespace stagewise::cli {
namespace {

struct KindStyle {
  v1::SpanKind kind;
  const char* name;
  const char* legend;
  const char* colour;
  bool thin;  // drawn as a thin bar (waiting), not a box
};

// Compute kinds first: the legend's order.
constexpr KindStyle kStyles[] = {
    {v1::SPAN_FORWARD, "forward", "forward", "#4e79a7", false},
    {v1::SPAN_BACKWARD, "backward", "backward", "#f28e2b", false},
    {v1::SPAN_BACKWARD_WEIGHT, "weight", "weight gradients (W)", "#e15759", false},
    {v1::SPAN_RECOMPUTE, "recompute", "recompute", "#edc948", false},
    {v1::SPAN_STEP, "step", "optimizer step", "#b07aa1", false},
    {v1::SPAN_AUX, "aux", "auxiliary", "#59a14f", false},
    {v1::SPAN_SEND, "send", "encode + send", "#76b7b2", false},
    {v1::SPAN_EVAL, "eval", "evaluation", "#9c755f", false},
    {v1::SPAN_CHECKPOINT, "checkpoint", "checkpoint", "#79706e", false},
    {v1::SPAN_WAIT_PREV, "wait_prev", "waiting for stage j-1", "#c7c7c7", true},
    {v1::SPAN_WAIT_NEXT, "wait_next", "waiting for stage j+1", "#8f8f8f", true},
};

const KindStyle* StyleOf(v1::SpanKind kind) {
  for (const KindStyle& s : kStyles) {
    if (s.kind == kind) return &s;
  }
  return nullptr;
}

// A JSON string literal.
std::string JsonString(const std::string& s) { return "\"" + JsonEscape(s) + "\""; }

std::string XmlText(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The first span's start and the last span's end over every stage.
std::pair<int64_t, int64_t> Extent(const v1::JobTrace& trace) {
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

std::string Title(const v1::JobTrace& trace) {
  std::string title = trace.name().empty() ? trace.job_id() : trace.name();
  if (!trace.algorithm().empty()) absl::StrAppend(&title, " (", trace.algorithm(), ")");
  const auto [lo, hi] = StepRange(trace);
  if (hi >= lo) absl::StrAppend(&title, ", mini-batches ", lo, "-", hi);
  return title;
}

// A "nice" tick spacing (1, 2 or 5 times a power of ten) for about `ticks`
// ticks over `span`.
double TickStep(double span, int ticks) {
  const double raw = span / std::max(1, ticks);
  const double p = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-9))));
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

}  // namespace

const char* SpanName(v1::SpanKind kind) {
  const KindStyle* s = StyleOf(kind);
  return s != nullptr ? s->name : "other";
}

std::string ChromeTraceJson(const v1::JobTrace& trace) {
  const auto [origin, end] = Extent(trace);
  int64_t rtt = -1;
  for (const v1::StageTrace& st : trace.stages()) rtt = std::max(rtt, st.clock_rtt_us());
  std::string out = "{\"displayTimeUnit\":\"ms\",\n\"otherData\":{";
  absl::StrAppend(
      &out, "\"job_id\":", JsonString(trace.job_id()), ",\"name\":", JsonString(trace.name()),
      ",\"algorithm\":", JsonString(trace.algorithm()), ",\"num_stages\":", trace.num_stages(),
      ",\"chunks_per_worker\":", std::max(1, trace.chunks_per_worker()), ",\"origin_unix_us\":\"",
      origin, "\",\"clock_rtt_us\":", rtt,
      ",\"dropped_at_coordinator\":", trace.dropped_at_coordinator(), "},\n");
  out += "\"traceEvents\":[\n";
  std::set<int> stages;
  for (const v1::StageTrace& st : trace.stages()) stages.insert(st.stage());
  for (int j = 0; j < trace.num_stages(); ++j) stages.insert(j);
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  for (const int j : stages) {
    sep();
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", j,
                    ",\"tid\":0,\"args\":{\"name\":\"stage ", j, "\"}}");
    sep();
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":", j,
                    ",\"tid\":0,\"args\":{\"sort_index\":", j, "}}");
    sep();
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", j,
                    ",\"tid\":0,\"args\":{\"name\":\"compute\"}}");
  }
  for (const v1::StageTrace& st : trace.stages()) {
    for (const v1::Span& s : st.spans()) {
      const KindStyle* style = StyleOf(s.kind());
      const char* cat = "compute";
      if (style != nullptr && style->thin) cat = "wait";
      if (s.kind() == v1::SPAN_SEND) cat = "transfer";
      sep();
      absl::StrAppend(&out, "{\"ph\":\"X\",\"name\":\"", SpanName(s.kind()), "\",\"cat\":\"", cat,
                      "\",\"pid\":", st.stage(), ",\"tid\":0,\"ts\":", s.start_us() - origin,
                      ",\"dur\":", s.duration_us(), ",\"args\":{\"step\":", s.step(),
                      ",\"micro_batch\":", s.micro_batch(), ",\"attempt\":", st.attempt(), "}}");
    }
  }
  for (const v1::StageTrace& st : trace.stages()) {
    if (st.dropped() == 0) continue;
    sep();
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"dropped_spans\",\"pid\":", st.stage(),
                    ",\"tid\":0,\"args\":{\"dropped\":", st.dropped(), "}}");
  }
  out += "\n]}\n";
  return out;
}

absl::StatusOr<v1::JobTrace> ParseChromeTrace(const std::string& json, const std::string& what) {
  google::protobuf::Struct root;
  google::protobuf::util::JsonParseOptions options;
  if (auto s = google::protobuf::util::JsonStringToMessage(json, &root, options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not JSON: ", std::string(s.message())));
  }
  const auto& fields = root.fields();
  auto events = fields.find("traceEvents");
  if (events == fields.end() || !events->second.has_list_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no traceEvents list (not a Chrome trace `stagewise trace` wrote)"));
  }
  v1::JobTrace trace;
  int64_t origin = 0;
  int64_t rtt = -1;
  if (auto other = fields.find("otherData"); other != fields.end()) {
    const auto& o = other->second.struct_value().fields();
    auto text = [&](const char* key) -> std::string {
      auto it = o.find(key);
      return it != o.end() ? it->second.string_value() : "";
    };
    auto number = [&](const char* key) -> double {
      auto it = o.find(key);
      return it != o.end() ? it->second.number_value() : 0;
    };
    trace.set_job_id(text("job_id"));
    trace.set_name(text("name"));
    trace.set_algorithm(text("algorithm"));
    trace.set_num_stages(static_cast<int>(number("num_stages")));
    trace.set_chunks_per_worker(static_cast<int>(number("chunks_per_worker")));
    trace.set_dropped_at_coordinator(static_cast<int64_t>(number("dropped_at_coordinator")));
    if (o.count("clock_rtt_us")) rtt = static_cast<int64_t>(number("clock_rtt_us"));
    if (!text("origin_unix_us").empty() && !absl::SimpleAtoi(text("origin_unix_us"), &origin)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": otherData.origin_unix_us: '", text("origin_unix_us"), "' is not an integer"));
    }
  }
  std::map<std::pair<int, int>, v1::StageTrace> by_stage;
  std::map<int, int64_t> dropped;
  int index = 0;
  for (const auto& event : events->second.list_value().values()) {
    const std::string where = absl::StrCat(what, ": traceEvents[", index++, "]");
    const auto& e = event.struct_value().fields();
    auto get = [&](const char* key) -> const google::protobuf::Value* {
      auto it = e.find(key);
      return it != e.end() ? &it->second : nullptr;
    };
    const google::protobuf::Value* ph = get("ph");
    const google::protobuf::Value* name = get("name");
    const google::protobuf::Value* pid = get("pid");
    if (ph == nullptr || name == nullptr || pid == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": needs ph, name and pid"));
    }
    const int stage = static_cast<int>(pid->number_value());
    const google::protobuf::Value* args = get("args");
    auto arg = [&](const char* key) -> double {
      if (args == nullptr) return 0;
      auto it = args->struct_value().fields().find(key);
      return it != args->struct_value().fields().end() ? it->second.number_value() : 0;
    };
    if (ph->string_value() == "M") {
      if (name->string_value() == "dropped_spans") {
        dropped[stage] = static_cast<int64_t>(arg("dropped"));
      }
      continue;
    }
    if (ph->string_value() != "X") continue;
    const google::protobuf::Value* ts = get("ts");
    const google::protobuf::Value* dur = get("dur");
    if (ts == nullptr || dur == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": an X event needs ts and dur"));
    }
    v1::SpanKind kind = v1::SPAN_KIND_UNSPECIFIED;
    for (const KindStyle& s : kStyles) {
      if (name->string_value() == s.name) kind = s.kind;
    }
    if (kind == v1::SPAN_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown span name '", name->string_value(), "'"));
    }
    const int attempt = static_cast<int>(arg("attempt"));
    v1::StageTrace& st = by_stage[{stage, attempt}];
    st.set_stage(stage);
    st.set_attempt(attempt);
    st.set_clock_rtt_us(rtt);  // the file keeps the worst stage's only
    v1::Span* span = st.add_spans();
    span->set_kind(kind);
    span->set_start_us(origin + std::llround(ts->number_value()));
    span->set_duration_us(std::llround(dur->number_value()));
    span->set_step(static_cast<int64_t>(arg("step")));
    span->set_micro_batch(static_cast<int>(arg("micro_batch")));
  }
  for (auto& [key, st] : by_stage) {
    if (auto it = dropped.find(key.first); it != dropped.end()) st.set_dropped(it->second);
    *trace.add_stages() = std::move(st);
  }
  return trace;
}

std::string TimelineSvg(const v1::JobTrace& trace) {
  const std::pair<int64_t, int64_t> extent = Extent(trace);
  const int64_t origin = extent.first, end = extent.second;
  int stages = trace.num_stages();
  for (const v1::StageTrace& st : trace.stages()) stages = std::max(stages, st.stage() + 1);
  stages = std::max(stages, 1);
  // Interleaved: a row per worker, which holds stages w, w + workers, ...
  const int chunks = std::max(1, trace.chunks_per_worker());
  const int workers = chunks > 1 && stages % chunks == 0 ? stages / chunks : stages;
  const bool by_worker = workers != stages;
  auto row_of = [&](int stage) { return by_worker ? stage % workers : stage; };
  const double span_ms = std::max<double>(static_cast<double>(end - origin) / 1000.0, 1e-3);
  // Layout (pixels).
  constexpr double kLeft = 78, kRight = 24, kTop = 46, kRow = 40, kGap = 10, kPlot = 1100;
  const double width = kLeft + kPlot + kRight;
  const double rows_bottom = kTop + workers * (kRow + kGap);
  const double legend_top = rows_bottom + 62;
  // The legend: every kind, kLegendPerLine to a line, then the box-label note.
  constexpr int kLegendPerLine = 5;
  constexpr int kKinds = static_cast<int>(sizeof(kStyles) / sizeof(kStyles[0]));
  const double legend_lines = (kKinds + kLegendPerLine - 1) / kLegendPerLine;
  const double height = legend_top + legend_lines * 22 + 16;
  auto x_of = [&](int64_t us) {
    return kLeft + kPlot * (static_cast<double>(us - origin) / 1000.0) / span_ms;
  };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height);
  absl::StrAppendFormat(
      &svg, "<text x=\"%.0f\" y=\"24\" font-size=\"16\" font-weight=\"bold\">%s</text>\n", kLeft,
      XmlText(Title(trace)));
  // Time axis: grid lines and labels in ms.
  const double tick = TickStep(span_ms, 10);
  for (double t = 0; t <= span_ms + 1e-9; t += tick) {
    const double x = kLeft + kPlot * t / span_ms;
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#e8e8e8\"/>\n"
        "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
        x, kTop - 6, x, rows_bottom, x, rows_bottom + 16,
        absl::StrFormat("%g", std::round(t * 1000) / 1000));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\">time "
                        "(ms, coordinator clock, from the first span)</text>\n",
                        kLeft + kPlot / 2, rows_bottom + 34);
  // Micro-batch numbers appear only when some span has one.
  bool micro = false;
  for (const v1::StageTrace& st : trace.stages()) {
    for (const v1::Span& s : st.spans()) micro = micro || s.micro_batch() > 0;
  }
  for (int j = 0; j < workers; ++j) {
    const double y = kTop + j * (kRow + kGap);
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.0f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"end\">%s "
                          "%d</text>\n<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
                          "fill=\"none\" stroke=\"#d0d0d0\"/>\n",
                          kLeft - 8, y + kRow / 2 + 4, by_worker ? "worker" : "stage", j, kLeft, y,
                          kPlot, kRow);
  }
  for (const v1::StageTrace& st : trace.stages()) {
    const double y = kTop + row_of(st.stage()) * (kRow + kGap);
    const int chunk = by_worker ? st.stage() / workers : 0;
    absl::StrAppendFormat(&svg, "<g id=\"stage%d-attempt%d\">\n", st.stage(), st.attempt());
    for (const v1::Span& s : st.spans()) {
      const KindStyle* style = StyleOf(s.kind());
      if (style == nullptr) continue;
      const double x0 = x_of(s.start_us());
      const double w = std::max(0.4, x_of(s.start_us() + s.duration_us()) - x0);
      std::string label = absl::StrCat(s.step());
      if (micro) absl::StrAppend(&label, ".", s.micro_batch());
      if (by_worker) label = absl::StrCat("c", chunk, ":", label);
      if (s.kind() == v1::SPAN_EVAL) label = "eval";
      if (s.kind() == v1::SPAN_CHECKPOINT) label = "ckpt";
      const std::string tip = absl::StrFormat(
          "%s%s, mini-batch %d%s: %.3f ms", style->legend,
          by_worker ? absl::StrCat(" of chunk ", chunk, " (stage ", st.stage(), ")") : "", s.step(),
          micro ? absl::StrCat(", micro-batch ", s.micro_batch()) : "",
          static_cast<double>(s.duration_us()) / 1000.0);
      if (style->thin) {
        absl::StrAppendFormat(&svg,
                              "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                              "fill=\"%s\"><title>%s</title></rect>\n",
                              x0, y + kRow * 0.4, w, kRow * 0.2, style->colour, XmlText(tip));
        continue;
      }
      // Odd mini-batches lighter, so neighbouring boxes of one kind part;
      // interleaved: odd chunks too.
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                            "fill=\"%s\" fill-opacity=\"%s\" stroke=\"white\" "
                            "stroke-width=\"0.5\"><title>%s</title></rect>\n",
                            x0, y + 2, w, kRow - 4, style->colour,
                            (s.step() + chunk) % 2 ? "0.7" : "1", XmlText(tip));
      const double chars = static_cast<double>(label.size());
      if (w >= chars * 5.6 + 2 && s.kind() != v1::SPAN_SEND) {
        absl::StrAppendFormat(&svg,
                              "<text x=\"%.2f\" y=\"%.1f\" font-size=\"9\" text-anchor=\"middle\" "
                              "fill=\"white\">%s</text>\n",
                              x0 + w / 2, y + kRow / 2 + 3.5, label);
      }
    }
    svg += "</g>\n";
  }
  int i = 0;
  for (const KindStyle& s : kStyles) {
    const double x = kLeft + (i % kLegendPerLine) * 220;
    const double y = legend_top + (i / kLegendPerLine) * 22;
    if (s.thin) {
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%.0f\" y=\"%.0f\" width=\"22\" height=\"4\" fill=\"%s\"/>\n",
                            x, y - 7, s.colour);
    } else {
      absl::StrAppendFormat(
          &svg, "<rect x=\"%.0f\" y=\"%.0f\" width=\"22\" height=\"12\" fill=\"%s\"/>\n", x, y - 11,
          s.colour);
    }
    absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">%s</text>\n", x + 28,
                          y, s.legend);
    ++i;
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" fill=\"#555\">box label: "
                        "%smini-batch%s</text>\n",
                        kLeft, legend_top + legend_lines * 22 + 8,
                        by_worker ? "c&lt;chunk&gt;:" : "", micro ? ".micro-batch" : "");
  svg += "</svg>\n";
  return svg;
}

std::string TraceSummary(const v1::JobTrace& trace) {
  const auto [origin, end] = Extent(trace);
  size_t spans = 0;
  for (const v1::StageTrace& st : trace.stages()) spans += st.spans_size();
  std::string out = absl::StrFormat("%s: %d stage%s, %d spans over %.1f ms\n", Title(trace),
                                    trace.num_stages(), trace.num_stages() == 1 ? "" : "s", spans,
                                    static_cast<double>(end - origin) / 1000.0);
  if (spans == 0) {
    out += "no spans: the job has no `trace:` section, or its window missed every step\n";
    return out;
  }
  if (const int v = trace.chunks_per_worker(); v > 1 && trace.num_stages() % v == 0) {
    const int workers = trace.num_stages() / v;
    absl::StrAppend(&out, "interleaved: ", workers, " workers x ", v,
                    " chunks; stage s is chunk s / ", workers, " of worker s mod ", workers,
                    " (its untraced time includes its worker's other chunks' turns)\n");
  }
  absl::StrAppend(&out, absl::StrFormat("%-7s %6s", "stage", "spans"));
  const std::vector<v1::SpanKind> columns = {
      v1::SPAN_FORWARD,   v1::SPAN_BACKWARD, v1::SPAN_BACKWARD_WEIGHT,
      v1::SPAN_RECOMPUTE, v1::SPAN_STEP,     v1::SPAN_AUX,
      v1::SPAN_SEND,      v1::SPAN_EVAL,     v1::SPAN_WAIT_PREV,
      v1::SPAN_WAIT_NEXT};
  for (const v1::SpanKind k : columns) absl::StrAppend(&out, absl::StrFormat(" %10s", SpanName(k)));
  absl::StrAppend(&out, absl::StrFormat(" %10s\n", "untraced"));
  for (const v1::StageTrace& st : trace.stages()) {
    // Shares of the stage's own recorded stretch, its first span to its last.
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (const v1::Span& s : st.spans()) {
      first = std::min(first, s.start_us());
      last = std::max(last, s.start_us() + s.duration_us());
    }
    const double total = std::max<double>(1, static_cast<double>(last - first));
    std::map<v1::SpanKind, int64_t> time;
    int64_t covered = 0;
    for (const v1::Span& s : st.spans()) {
      time[s.kind()] += s.duration_us();
      covered += s.duration_us();
    }
    std::string name = absl::StrCat(st.stage());
    if (st.attempt() > 0) absl::StrAppend(&name, "/", st.attempt());
    absl::StrAppend(&out, absl::StrFormat("%-7s %6d", name, st.spans_size()));
    for (const v1::SpanKind k : columns) {
      absl::StrAppend(&out,
                      absl::StrFormat(" %9.1f%%", 100.0 * static_cast<double>(time[k]) / total));
    }
    absl::StrAppend(
        &out, absl::StrFormat(" %9.1f%%",
                              100.0 * std::max(0.0, total - static_cast<double>(covered)) / total));
    if (st.dropped() > 0) absl::StrAppend(&out, "  (", st.dropped(), " spans not kept)");
    out += "\n";
  }
  if (trace.dropped_at_coordinator() > 0) {
    absl::StrAppend(&out, trace.dropped_at_coordinator(),
                    " spans not stored: the coordinator keeps at most 150000 per job\n");
  }
  return out;
}

}  // namespace stagewise::cli
