// `stagewise doctor`: where a pipeline loses its time, read off its trace
// (docs/trace.md, "Doctor"): per stage how busy it is and whom it waits for,
// its longest wait, the stage the others wait on when one stands out, and a
// stage slower than its plan. No LibTorch, no gRPC: the unit tests feed it
// synthetic traces.
#ifndef STAGEWISE_CLIENTS_CLI_DOCTOR_H_
#define STAGEWISE_CLIENTS_CLI_DOCTOR_H_

#include <map>
#include <string>
#include <vector>

#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::cli {

// One stage (of the trace's latest attempt) as the doctor sees it. Shares are
// of the stage's recorded stretch, its first span to its last.
struct StageHealth {
  int stage = 0;
  double busy = 0;                  // computing, encoding and sending, evaluating, checkpointing
  double wait_prev = 0;             // blocked on stage j-1's activation
  double wait_next = 0;             // blocked on stage j+1's gradient
  double compute_ms_per_batch = 0;  // forward, backward, W, recompute, step and aux
  // The longest single wait: its kind, length and the micro-batch it waited for.
  v1::SpanKind longest_kind = v1::SPAN_KIND_UNSPECIFIED;
  double longest_ms = 0;
  int64_t longest_step = 0;
  int longest_micro_batch = 0;
};

struct Diagnosis {
  std::vector<StageHealth> stages;  // by stage
  // The stage the others wait on: the busiest one when it is at least
  // kBottleneckRatio x the median stage's busy share; -1 when none stands out.
  int bottleneck = -1;
  // Stages whose compute per mini-batch is at least kSlowRatio x the plan's
  // prediction (summary plan.stage<j>.seconds_per_batch), with the ratio.
  std::map<int, double> slower_than_planned;
};
inline constexpr double kBottleneckRatio = 1.15;
inline constexpr double kSlowRatio = 1.25;

// `summary`: the job's summary (for the plan), may be empty.
Diagnosis Diagnose(const v1::JobTrace& trace, const std::map<std::string, double>& summary);

// The report: a table per stage, then the findings in sentences. `workers`:
// the worker of each stage (by stage; empty when unknown, e.g. from a file).
std::string DiagnosisText(const v1::JobTrace& trace, const Diagnosis& d,
                          const std::vector<std::string>& workers);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_DOCTOR_H_
