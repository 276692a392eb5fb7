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
#include "clients/cli/conventions.h"
#include "services/render/svg.h"
#include "services/render/timeline.h"

namespace stagewise::cli {
namespace {

// A JSON string literal.
std::string JsonString(const std::string& s) { return "\"" + JsonEscape(s) + "\""; }

}  // namespace

const char* SpanName(v1::SpanKind kind) {
  const render::SpanStyle* s = render::StyleOf(kind);
  return s != nullptr ? s->name : "other";
}

std::string ChromeTraceJson(const v1::JobTrace& trace) {
  const auto [origin, end] = render::TraceExtent(trace);
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
      const render::SpanStyle* style = render::StyleOf(s.kind());
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
    for (const render::SpanStyle& s : render::SpanStyles()) {
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

std::string TimelineSvg(const v1::JobTrace& trace) { return render::TimelineSvg(trace); }

std::string TraceSummary(const v1::JobTrace& trace) {
  const auto [origin, end] = render::TraceExtent(trace);
  size_t spans = 0;
  for (const v1::StageTrace& st : trace.stages()) spans += st.spans_size();
  std::string out = absl::StrFormat(
      "%s: %d stage%s, %d spans over %.1f ms\n", render::TraceTitle(trace), trace.num_stages(),
      trace.num_stages() == 1 ? "" : "s", spans, static_cast<double>(end - origin) / 1000.0);
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
