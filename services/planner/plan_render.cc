// What the planner's results look like to people and programs: the profile
// and plan as text (`stagewise plan`), as JSON (`-o json`), the plan's
// entries in a job's summary, and the labels of its predictions
// (services/planner/planner.h declares them).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "services/planner/planner.h"

namespace stagewise::planner {
namespace {

std::string Ms(double s) { return absl::StrFormat("%.2fms", s * 1e3); }

}  // namespace

std::string LabelOf(const PredictionKey& key) {
  std::string label(NameOf(key.algorithm));
  if (key.schedule.has_value()) {
    absl::StrAppend(&label, " ", NameOf(*key.schedule));
    if (*key.schedule == PipelineSchedule::kInterleaved) absl::StrAppend(&label, " v=", key.chunks);
    absl::StrAppend(&label, " M=", key.micro_batches);
  }
  if (key.algorithm == AlgorithmKind::kNwise) absl::StrAppend(&label, " n=", key.nwise_n);
  return label;
}

std::string HumanBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return absl::StrCat(bytes, "B");
  if (b < 1048576.0) return absl::StrFormat("%.1fKiB", b / 1024);
  if (b < 1073741824.0) return absl::StrFormat("%.1fMiB", b / 1048576);
  return absl::StrFormat("%.2fGiB", b / 1073741824);
}

std::string ProfileText(const ModelProfile& p) {
  std::string out = absl::StrFormat("profile of %s, batch %d, %s, %d threads (median of %d runs)\n",
                                    p.model, p.batch_size, p.device, p.threads, p.repeats);
  absl::StrAppend(&out, absl::StrFormat("%-5s %-10s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "block",
                                        "kind", "fwd", "fwd-nograd", "bwd", "rebuild", "inverse",
                                        "activation", "graph", "params", "optimizer"));
  for (const auto& b : p.blocks) {
    absl::StrAppend(
        &out, absl::StrFormat("%-5d %-10s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", b.index, b.kind,
                              Ms(b.forward_s), Ms(b.forward_nograd_s), Ms(b.backward_s),
                              b.reversible ? Ms(b.rebuild_backward_s) : "-",
                              b.reversible ? Ms(b.inverse_s) : "-", HumanBytes(b.output_bytes),
                              HumanBytes(b.graph_bytes), HumanBytes(b.parameter_bytes),
                              HumanBytes(b.optimizer_bytes)));
  }
  return out;
}

std::vector<std::pair<std::string, double>> PlanSummary(const Plan& plan) {
  std::vector<std::pair<std::string, double>> out;
  for (size_t j = 0; j < plan.stages.size(); ++j) {
    const StagePlan& s = plan.stages[j];
    const std::string prefix = absl::StrCat("plan.stage", j, ".");
    int rebuilt = 0;
    for (size_t i = 0; i < s.store.size(); ++i) rebuilt += s.store[i] ? 0 : 1;
    out.emplace_back(prefix + "block_begin", s.begin);
    out.emplace_back(prefix + "block_end", s.end);
    out.emplace_back(prefix + "peak_bytes", static_cast<double>(s.estimate.peak_bytes));
    out.emplace_back(prefix + "seconds_per_batch", s.estimate.time_s() + s.estimate.aux_head_s);
    if (s.estimate.link_s > 0) out.emplace_back(prefix + "link_seconds", s.estimate.link_s);
    out.emplace_back(prefix + "rebuild_blocks", rebuilt);
    if (plan.algorithm == AlgorithmKind::kDelayed)
      out.emplace_back(prefix + "in_flight", s.role.inflight);
  }
  for (const Prediction& p : plan.predictions) {
    out.emplace_back(
        absl::StrCat("plan.predicted.",
                     absl::StrReplaceAll(p.label(), {{" ", "_"}, {"=", ""}, {"-", "_"}})),
        p.seconds_per_batch);
  }
  return out;
}

namespace {

// What each stage sends with, when any format is not none:
//   "wire formats (transport.compression): stage 0 forward int4; stage 1
//    backward bf16, forward int8; ..."
std::string WireText(const Plan& plan) {
  const bool chosen = plan.forward_wire.compression == Compression::kAuto ||
                      plan.backward_wire.compression == Compression::kAuto;
  std::string stages;
  bool lossy = false;
  for (size_t j = 0; j < plan.stages.size(); ++j) {
    const StagePlan& s = plan.stages[j];
    std::vector<std::string> sends;
    if (!s.role.first) sends.push_back(absl::StrCat("backward ", NameOf(s.estimate.backward_wire)));
    if (!s.role.last) sends.push_back(absl::StrCat("forward ", NameOf(s.estimate.forward_wire)));
    for (Compression c : {s.estimate.forward_wire, s.estimate.backward_wire}) {
      lossy = lossy || c != Compression::kNone;
    }
    if (sends.empty()) continue;
    absl::StrAppend(&stages, stages.empty() ? "" : "; ", "stage ", j, " ",
                    absl::StrJoin(sends, ", "));
  }
  if (!lossy && !chosen) return "";
  return absl::StrCat("wire formats (transport.compression",
                      chosen ? ": auto, the least lossy whose link time fits under the stage's "
                               "compute"
                             : "",
                      "): ", stages, "\n");
}

}  // namespace

std::string PlanText(const ModelProfile& p, const Plan& plan) {
  std::string out =
      absl::StrFormat("plan for %s, batch %d, %s, %d threads; algorithm %s\n", p.model,
                      p.batch_size, p.device, p.threads, NameOf(plan.algorithm));
  absl::StrAppend(&out, absl::StrFormat("%-5s %-9s %9s %9s %9s %9s %9s %10s %10s %10s\n", "stage",
                                        "blocks", "forward", "backward", "step", "messages", "time",
                                        "kept/batch", "peak", "cap"));
  for (size_t j = 0; j < plan.stages.size(); ++j) {
    const StagePlan& s = plan.stages[j];
    const StageEstimate& e = s.estimate;
    absl::StrAppend(&out, absl::StrFormat("%-5d %-9s %9s %9s %9s %9s %9s %10s %10s %10s\n", j,
                                          absl::StrCat("[", s.begin, ",", s.end, ")"),
                                          Ms(e.forward_s), Ms(e.backward_s), Ms(e.step_s),
                                          Ms(e.message_s), Ms(e.time_s() + e.aux_head_s),
                                          HumanBytes(e.kept_bytes), HumanBytes(e.peak_bytes),
                                          s.cap_bytes > 0 ? HumanBytes(s.cap_bytes) : "-"));
  }
  std::string links;
  for (size_t j = 0; j < plan.stages.size(); ++j) {
    const double link_s = plan.stages[j].estimate.link_s;
    if (link_s > 0)
      absl::StrAppend(&links, links.empty() ? "" : ", ", "stage ", j, " ", Ms(link_s));
  }
  if (!links.empty()) {
    absl::StrAppend(&out, "sending over the links (placement.link_gbps, in time): ", links, "\n");
  }
  absl::StrAppend(&out, WireText(plan));
  if (plan.algorithm == AlgorithmKind::kDelayed && plan.stages.size() > 1) {
    std::string depths;
    for (size_t j = 0; j < plan.stages.size(); ++j) {
      absl::StrAppend(&depths, j == 0 ? "" : ", ", "stage ", j, " ", plan.stages[j].role.inflight);
    }
    absl::StrAppend(&out,
                    "mini-batches in flight (algorithm.max_in_flight; staleness = in flight - 1): ",
                    depths, "\n");
  }
  absl::StrAppend(&out, "reversible blocks (store = compute-centric, rebuild = memory-centric):\n");
  bool any = false;
  for (size_t j = 0; j < plan.stages.size(); ++j) {
    const StagePlan& s = plan.stages[j];
    std::string line;
    for (int i = s.begin; i < s.end; ++i) {
      if (!p.blocks[i].reversible) continue;
      absl::StrAppend(&line, line.empty() ? "" : ", ", i, " ",
                      s.store[i - s.begin] ? "store" : "rebuild");
    }
    if (line.empty()) continue;
    any = true;
    absl::StrAppend(&out, "  stage ", j, ": ", line, "\n");
  }
  if (!any) absl::StrAppend(&out, "  (none)\n");
  absl::StrAppend(&out, "predicted time per mini-batch on this partition:\n");
  absl::StrAppend(&out, absl::StrFormat("  %-22s %10s %9s %9s  %s\n", "algorithm", "time",
                                        "speed-up", "staleness", "model"));
  const Prediction* exact = nullptr;      // the fastest exact schedule
  const Prediction* decoupled = nullptr;  // the fastest decoupled algorithm
  for (const auto& pr : plan.predictions) {
    absl::StrAppend(
        &out, absl::StrFormat("  %-22s %10s %8.2fx %9d  %s\n", pr.label(), Ms(pr.seconds_per_batch),
                              pr.speedup, pr.staleness, pr.model));
    if (pr.seconds_per_batch <= 0) continue;
    // (nwise's and auxnet's models know no link latency yet: not compared.)
    const AlgorithmKind a = pr.key.algorithm;
    const bool modelled = a == AlgorithmKind::kDelayed || a == AlgorithmKind::kPetra ||
                          a == AlgorithmKind::kFeaturesReplay;
    if (a != AlgorithmKind::kBackprop && !modelled) continue;
    const Prediction*& best = a == AlgorithmKind::kBackprop ? exact : decoupled;
    if (best == nullptr || pr.seconds_per_batch < best->seconds_per_batch) best = &pr;
  }
  if (exact != nullptr && decoupled != nullptr) {
    const double ratio = exact->seconds_per_batch / decoupled->seconds_per_batch;
    absl::StrAppend(
        &out, absl::StrFormat("fastest exact: %s (%s); fastest decoupled: %s (%s, %d steps "
                              "stale); %s %.2fx faster per mini-batch%s\n",
                              exact->label(), Ms(exact->seconds_per_batch), decoupled->label(),
                              Ms(decoupled->seconds_per_batch), decoupled->staleness,
                              ratio >= 1 ? decoupled->label() : exact->label(),
                              ratio >= 1 ? ratio : 1 / ratio,
                              ratio >= 1 ? " (staleness may cost quality: docs/results.md)" : ""));
  }
  return out;
}

std::string PlanJson(const ModelProfile& p, const Plan& plan) {
  std::string out = absl::StrFormat(
      "{\"model\": \"%s\", \"batch_size\": %d, \"device\": \"%s\", \"threads\": %d, "
      "\"algorithm\": \"%s\", \"bottleneck_seconds\": %.6g, \"stages\": [",
      p.model, p.batch_size, p.device, p.threads, NameOf(plan.algorithm), plan.bottleneck_s);
  for (size_t j = 0; j < plan.stages.size(); ++j) {
    const StagePlan& s = plan.stages[j];
    const StageEstimate& e = s.estimate;
    std::string modes;
    for (int i = s.begin; i < s.end; ++i) {
      absl::StrAppend(&modes, i > s.begin ? ", " : "", "\"",
                      !p.blocks[i].reversible ? "fixed"
                      : s.store[i - s.begin]  ? "store"
                                              : "rebuild",
                      "\"");
    }
    absl::StrAppend(
        &out, j ? ", " : "",
        absl::StrFormat("{\"stage\": %d, \"blocks\": [%d, %d], \"modes\": [%s], "
                        "\"forward_seconds\": %.6g, \"backward_seconds\": %.6g, "
                        "\"step_seconds\": %.6g, \"message_seconds\": %.6g, "
                        "\"aux_head_seconds\": %.6g, \"kept_bytes\": %d, \"peak_bytes\": %d, "
                        "\"static_bytes\": %d, \"cap_bytes\": %d, \"inflight\": %d, "
                        "\"parameter_copies\": %d, "
                        "\"link_seconds\": %.6g, \"forward_wire\": \"%s\", "
                        "\"backward_wire\": \"%s\", \"output_bytes\": %d}",
                        j, s.begin, s.end, modes, e.forward_s, e.backward_s, e.step_s, e.message_s,
                        e.aux_head_s, e.kept_bytes, e.peak_bytes, e.static_bytes, s.cap_bytes,
                        s.role.inflight, s.role.parameter_copies, e.link_s, NameOf(e.forward_wire),
                        NameOf(e.backward_wire), p.blocks[s.end - 1].output_bytes));
  }
  absl::StrAppend(&out, "], \"predictions\": [");
  for (size_t i = 0; i < plan.predictions.size(); ++i) {
    const Prediction& pr = plan.predictions[i];
    absl::StrAppend(&out, i ? ", " : "",
                    absl::StrFormat("{\"algorithm\": \"%s\", \"seconds_per_batch\": %.6g, "
                                    "\"speedup\": %.4f, \"staleness_steps\": %d}",
                                    pr.label(), pr.seconds_per_batch, pr.speedup, pr.staleness));
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}
}  // namespace stagewise::planner
