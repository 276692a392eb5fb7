// SVG building blocks shared by the CLI's files and the status pages: text
// escaping, tick spacing, the colours and names of trace spans, and a line
// chart (services/render: one home for what people look at).
#ifndef STAGEWISE_SERVICES_RENDER_SVG_H_
#define STAGEWISE_SERVICES_RENDER_SVG_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::render {

// `s` with & < > " ' escaped: safe as XML/HTML text and attribute values.
std::string XmlEscape(const std::string& s);

// A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about
// `ticks` ticks over `span` (> 0).
double TickStep(double span, int ticks);

// A number as a tick label: %g with at most `digits` significant digits,
// and an exact 0 (no -0, no 1e-17 from adding up steps).
std::string TickLabel(double v, double step, int digits = 6);

// How a span kind is named and drawn. Compute kinds come first: the legend's
// order.
struct SpanStyle {
  v1::SpanKind kind;
  const char* name;    // in JSON and summaries: "forward", "wait_prev", ...
  const char* legend;  // in the legend and tooltips: "waiting for stage j-1"
  const char* colour;
  bool thin;  // a thin bar (waiting), not a box
};
absl::Span<const SpanStyle> SpanStyles();
// nullptr for kinds without a style (SPAN_UNSPECIFIED, newer kinds).
const SpanStyle* StyleOf(v1::SpanKind kind);
// Waiting for a neighbour (the receive waits), as opposed to work.
bool IsWait(v1::SpanKind kind);

// A line chart: series name -> (x, y) points in order, each a
// <polyline data-series="name" data-points="n"> (a lone point also a dot);
// non-finite y values are skipped. Both axes have ticks with their values;
// `x_label` and `y_label` name them with their units. The root is an
// <svg class="curve" data-title="title">; with no finite point it says
// "no samples yet".
struct ChartOptions {
  double width = 420;
  double height = 230;
  std::string x_label = "step";
  std::string y_label;
};
std::string LineChartSvg(
    const std::string& title,
    const std::map<std::string, std::vector<std::pair<double, double>>>& series,
    const ChartOptions& options);

}  // namespace stagewise::render

#endif  // STAGEWISE_SERVICES_RENDER_SVG_H_
