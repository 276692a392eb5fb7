#include "clients/cli/doctor.h"

#include <algorithm>
#include <climits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stagewise::cli {
namespace {

bool IsWait(v1::SpanKind k) { return k == v1::SPAN_WAIT_PREV || k == v1::SPAN_WAIT_NEXT; }

bool IsCompute(v1::SpanKind k) {
  return k == v1::SPAN_FORWARD || k == v1::SPAN_BACKWARD || k == v1::SPAN_BACKWARD_WEIGHT ||
         k == v1::SPAN_RECOMPUTE || k == v1::SPAN_STEP || k == v1::SPAN_AUX;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Pct(double share) { return absl::StrFormat("%.1f%%", 100 * share); }

std::string On(const std::vector<std::string>& workers, int stage) {
  return stage < static_cast<int>(workers.size()) && !workers[stage].empty()
             ? absl::StrCat(" (on ", workers[stage], ")")
             : "";
}

}  // namespace

Diagnosis Diagnose(const v1::JobTrace& trace, const std::map<std::string, double>& summary) {
  // The latest attempt of every stage: a recovered job's earlier ones are over.
  std::map<int, const v1::StageTrace*> latest;
  for (const v1::StageTrace& st : trace.stages()) {
    auto& slot = latest[st.stage()];
    if (slot == nullptr || st.attempt() > slot->attempt()) slot = &st;
  }
  Diagnosis d;
  for (const auto& [stage, st] : latest) {
    StageHealth h;
    h.stage = stage;
    int64_t first = INT64_MAX, last = INT64_MIN;
    double busy = 0, prev = 0, next = 0, compute = 0;
    std::set<int64_t> steps;
    for (const v1::Span& s : st->spans()) {
      first = std::min(first, s.start_us());
      last = std::max(last, s.start_us() + s.duration_us());
      const double us = static_cast<double>(s.duration_us());
      if (s.kind() == v1::SPAN_WAIT_PREV) prev += us;
      if (s.kind() == v1::SPAN_WAIT_NEXT) next += us;
      if (!IsWait(s.kind())) busy += us;
      if (IsCompute(s.kind())) {
        compute += us;
        steps.insert(s.step());
      }
      if (IsWait(s.kind()) && us / 1e3 > h.longest_ms) {
        h.longest_ms = us / 1e3;
        h.longest_kind = s.kind();
        h.longest_step = s.step();
        h.longest_micro_batch = s.micro_batch();
      }
    }
    const double total = last > first ? static_cast<double>(last - first) : 1;
    h.busy = std::min(1.0, busy / total);
    h.wait_prev = prev / total;
    h.wait_next = next / total;
    h.compute_ms_per_batch = steps.empty() ? 0 : compute / 1e3 / static_cast<double>(steps.size());
    d.stages.push_back(h);
  }
  if (d.stages.size() >= 2) {
    std::vector<double> busy;
    for (const StageHealth& h : d.stages) busy.push_back(h.busy);
    const double median = Median(busy);
    const auto top = std::max_element(d.stages.begin(), d.stages.end(),
                                      [](const auto& a, const auto& b) { return a.busy < b.busy; });
    if (median > 0 && top->busy >= kBottleneckRatio * median) d.bottleneck = top->stage;
  }
  for (const StageHealth& h : d.stages) {
    auto it = summary.find(absl::StrCat("plan.stage", h.stage, ".seconds_per_batch"));
    if (it == summary.end() || it->second <= 0) continue;
    const double ratio = h.compute_ms_per_batch / (1e3 * it->second);
    if (ratio >= kSlowRatio) d.slower_than_planned[h.stage] = ratio;
  }
  return d;
}

std::string DiagnosisText(const v1::JobTrace& trace, const Diagnosis& d,
                          const std::vector<std::string>& workers) {
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const v1::StageTrace& st : trace.stages()) {
    for (const v1::Span& s : st.spans()) {
      lo = std::min(lo, s.step());
      hi = std::max(hi, s.step());
    }
  }
  std::string out = absl::StrCat("doctor: ", trace.name().empty() ? trace.job_id() : trace.name(),
                                 " (", trace.algorithm(), ")");
  if (d.stages.empty()) {
    out += ": no spans to read (the job has no `trace:` section, or its window missed it)\n";
    return out;
  }
  absl::StrAppend(&out, ", mini-batches ", lo, "-", hi, ", ", d.stages.size(), " stages\n");
  absl::StrAppend(&out, absl::StrFormat("%-6s %-18s %7s %10s %10s  %s\n", "stage", "worker", "busy",
                                        "waits j-1", "waits j+1", "longest wait"));
  for (const StageHealth& h : d.stages) {
    const std::string worker =
        h.stage < static_cast<int>(workers.size()) ? workers[h.stage].substr(0, 18) : "-";
    std::string longest = "-";
    if (h.longest_kind != v1::SPAN_KIND_UNSPECIFIED) {
      longest = absl::StrFormat("%.1f ms for stage %d's %s of %d.%d", h.longest_ms,
                                h.longest_kind == v1::SPAN_WAIT_PREV ? h.stage - 1 : h.stage + 1,
                                h.longest_kind == v1::SPAN_WAIT_PREV ? "activation" : "gradient",
                                h.longest_step, h.longest_micro_batch);
    }
    absl::StrAppend(&out,
                    absl::StrFormat("%-6d %-18s %7s %10s %10s  %s\n", h.stage, worker, Pct(h.busy),
                                    Pct(h.wait_prev), Pct(h.wait_next), longest));
  }
  std::vector<double> busy;
  for (const StageHealth& h : d.stages) busy.push_back(h.busy);
  if (d.bottleneck >= 0) {
    const StageHealth& b = *std::find_if(d.stages.begin(), d.stages.end(),
                                         [&](const auto& h) { return h.stage == d.bottleneck; });
    absl::StrAppend(&out, "bottleneck: stage ", b.stage, On(workers, b.stage), " is busy ",
                    Pct(b.busy), " of its time against a median stage's ", Pct(Median(busy)),
                    absl::StrFormat(" (%.2fx)", b.busy / std::max(1e-9, Median(busy))));
    for (const StageHealth& h : d.stages) {
      if (h.stage == b.stage - 1 && h.wait_next > 0) {
        absl::StrAppend(&out, "; stage ", h.stage, " waits for its gradients ", Pct(h.wait_next),
                        " of its time");
      }
      if (h.stage == b.stage + 1 && h.wait_prev > 0) {
        absl::StrAppend(&out, "; stage ", h.stage, " waits for its activations ", Pct(h.wait_prev),
                        " of its time");
      }
    }
    out += "\n";
  } else {
    const auto [least, most] = std::minmax_element(busy.begin(), busy.end());
    absl::StrAppend(&out, "no stage stands out: every stage is busy ", Pct(*least), "-", Pct(*most),
                    " of its time; the rest is the schedule's bubble and the messages, not one "
                    "slow stage\n");
  }
  for (const auto& entry : d.slower_than_planned) {
    const int stage = entry.first;
    const double ratio = entry.second;
    const StageHealth& h = *std::find_if(d.stages.begin(), d.stages.end(),
                                         [stage](const auto& x) { return x.stage == stage; });
    absl::StrAppend(&out,
                    absl::StrFormat("slower than planned: stage %d%s computes %.1f ms per "
                                    "mini-batch, %.2fx the plan's prediction: its worker is "
                                    "slower than the one profiled, or busy with something else\n",
                                    stage, On(workers, stage), h.compute_ms_per_batch, ratio));
  }
  return out;
}

}  // namespace stagewise::cli
