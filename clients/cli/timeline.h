// Pipeline timelines (`stagewise trace`, `stagewise local --trace`): the
// spans a job's stages recorded, as Chrome trace / Perfetto JSON, as an SVG
// pipeline diagram (stages as rows, a box per mini-batch and pass) and as a
// text summary (docs/trace.md).
#ifndef STAGEWISE_CLIENTS_CLI_TIMELINE_H_
#define STAGEWISE_CLIENTS_CLI_TIMELINE_H_

#include <string>

#include "absl/status/statusor.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::cli {

// The span kind's name in the JSON and the legend ("forward", "wait_prev", ...).
const char* SpanName(v1::SpanKind kind);

// Chrome's trace event format: one process per stage ("stage j"), its
// compute thread as thread 0, a complete ("X") event per span with
// args {step, micro_batch, attempt}; timestamps in microseconds since the
// first span (otherData.origin_unix_us: that moment on the coordinator's
// clock). Opens in ui.perfetto.dev and chrome://tracing.
std::string ChromeTraceJson(const v1::JobTrace& trace);
// Reads back what ChromeTraceJson wrote; INVALID_ARGUMENT naming `what` and
// the problem for anything else.
absl::StatusOr<v1::JobTrace> ParseChromeTrace(const std::string& json, const std::string& what);

// The pipeline diagram: a row per stage, time to the right, a coloured box
// per span labelled with its mini-batch (and micro-batch), waits as thin
// grey bars so that bubbles show; a time axis and a legend.
std::string TimelineSvg(const v1::JobTrace& trace);

// Per stage: spans, and the share of its recorded stretch (its first span's
// start to its last span's end) spent in each kind, and untraced.
std::string TraceSummary(const v1::JobTrace& trace);

// Writes ChromeTraceJson to `json` and TimelineSvg to `svg` (each atomically;
// "" = not that one). INVALID_ARGUMENT unless `svg` ends in .svg.
absl::Status WriteTraceFiles(const v1::JobTrace& trace, const std::string& json,
                             const std::string& svg);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_TIMELINE_H_
