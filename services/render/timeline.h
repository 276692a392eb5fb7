// The pipeline timeline of a job's trace as SVG: the same drawing for
// `stagewise trace --svg` / `local --timeline` (the whole trace) and for the
// status page (its last steps: LastSteps).
#ifndef STAGEWISE_SERVICES_RENDER_TIMELINE_H_
#define STAGEWISE_SERVICES_RENDER_TIMELINE_H_

#include <cstdint>
#include <string>
#include <utility>

#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::render {

// The first span's start and the last span's end over every stage ({0, 0}
// without spans), in the trace's microseconds.
std::pair<int64_t, int64_t> TraceExtent(const v1::JobTrace& trace);

// The title: the job's name (or id), its algorithm, and the mini-batches the
// spans cover ("tiny (petra), mini-batches 4-9").
std::string TraceTitle(const v1::JobTrace& trace);

// A row per stage (a row per worker when the trace is interleaved), time to
// the right from the first span, a box per span coloured by kind and
// labelled with its mini-batch (and micro-batch), waits as thin bars so that
// bubbles show; a time axis in ms and a legend naming every colour. The root
// is <svg class="timeline">; each StageTrace a <g class="track"
// data-stage="j" id="stageJ-attemptA">; each span a <rect class="span"
// data-kind="forward"> with a tooltip. A trace without spans draws a note
// saying so.
std::string TimelineSvg(const v1::JobTrace& trace);

// The trace cut to its last `steps` recorded mini-batches (from the first
// span of the earliest of them to the last span's end, at most `max_us`
// long), each stage's latest attempt only, spans clipped to that window.
v1::JobTrace LastSteps(const v1::JobTrace& trace, int steps, int64_t max_us);

}  // namespace stagewise::render

#endif  // STAGEWISE_SERVICES_RENDER_TIMELINE_H_
