#include "services/render/svg.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stagewise::render {
namespace {

constexpr SpanStyle kStyles[] = {
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

constexpr const char* kSeriesColours[] = {"#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a"};

}  // namespace

std::string XmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

double TickStep(double span, int ticks) {
  const double raw = span / std::max(1, ticks);
  const double p = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-12))));
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

std::string TickLabel(double v, double step, int digits) {
  if (std::abs(v) < step * 1e-6) return "0";
  return absl::StrFormat("%.*g", digits, v);
}

absl::Span<const SpanStyle> SpanStyles() { return kStyles; }

const SpanStyle* StyleOf(v1::SpanKind kind) {
  for (const SpanStyle& s : kStyles) {
    if (s.kind == kind) return &s;
  }
  return nullptr;
}

bool IsWait(v1::SpanKind kind) { return kind == v1::SPAN_WAIT_PREV || kind == v1::SPAN_WAIT_NEXT; }

std::string LineChartSvg(
    const std::string& title,
    const std::map<std::string, std::vector<std::pair<double, double>>>& series,
    const ChartOptions& options) {
  const double kW = options.width, kH = options.height;
  constexpr double kLeft = 56, kRight = 12, kTop = 22, kBottom = 40;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& [name, points] : series) {
    for (const auto& [x, y] : points) {
      if (!std::isfinite(y) || !std::isfinite(x)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  std::string out = absl::StrFormat(
      "<svg class=\"curve\" data-title=\"%s\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" xmlns=\"http://www.w3.org/2000/svg\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"><text x=\"%.0f\" y=\"15\" "
      "font-size=\"13\">%s</text>",
      XmlEscape(title), kW, kH, kW, kH, kLeft, XmlEscape(title));
  if (!std::isfinite(x0)) {
    absl::StrAppendFormat(&out, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#777\">no samples yet</text>",
                          kLeft, kH / 2);
    return out + "</svg>";
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1);
  const double plot_w = kW - kLeft - kRight, plot_h = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * plot_w; };
  auto py = [&](double y) { return kH - kBottom - (y - y0) / (y1 - y0) * plot_h; };
  absl::StrAppendFormat(&out,
                        "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
                        "stroke=\"#ccc\"/>",
                        kLeft, kTop, plot_w, plot_h);
  // Ticks: grid lines with their values, about 4 on y and 5 on x.
  const double ys = TickStep(y1 - y0, 4);
  for (double v = std::ceil(y0 / ys - 1e-9) * ys; v <= y1 + ys * 1e-9; v += ys) {
    absl::StrAppendFormat(&out,
                          "<line class=\"tick\" x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" "
                          "stroke=\"#eee\"/><text x=\"%.0f\" y=\"%.1f\" font-size=\"10\" "
                          "text-anchor=\"end\">%s</text>",
                          kLeft, py(v), kLeft + plot_w, py(v), kLeft - 4, py(v) + 3.5,
                          TickLabel(v, ys, 4));
  }
  const double xs = TickStep(x1 - x0, 5);
  for (double v = std::ceil(x0 / xs - 1e-9) * xs; v <= x1 + xs * 1e-9; v += xs) {
    absl::StrAppendFormat(&out,
                          "<line class=\"tick\" x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" "
                          "stroke=\"#eee\"/><text x=\"%.1f\" y=\"%.0f\" font-size=\"10\" "
                          "text-anchor=\"middle\">%s</text>",
                          px(v), kTop, px(v), kTop + plot_h, px(v), kTop + plot_h + 13,
                          TickLabel(v, xs));
  }
  absl::StrAppendFormat(&out,
                        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">%s"
                        "</text><text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" "
                        "text-anchor=\"end\">%s</text>",
                        kLeft + plot_w / 2, kH - 8, XmlEscape(options.x_label), kW - kRight,
                        kTop - 8, XmlEscape(options.y_label));
  int i = 0;
  for (const auto& [name, points] : series) {
    const char* colour = kSeriesColours[i % 4];
    std::vector<std::string> xy;
    const std::pair<double, double>* lone = nullptr;
    for (const auto& point : points) {
      if (!std::isfinite(point.second) || !std::isfinite(point.first)) continue;
      xy.push_back(absl::StrFormat("%.1f,%.1f", px(point.first), py(point.second)));
      lone = &point;
    }
    absl::StrAppendFormat(&out,
                          "<polyline data-series=\"%s\" data-points=\"%d\" fill=\"none\" "
                          "stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>",
                          XmlEscape(name), xy.size(), colour, absl::StrJoin(xy, " "));
    if (xy.size() == 1) {  // one sample: a dot, a line of one point draws nothing
      absl::StrAppendFormat(&out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>",
                            px(lone->first), py(lone->second), colour);
    }
    absl::StrAppendFormat(&out,
                          "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" fill=\"%s\">%s</text>",
                          kLeft + 8 + 120 * i, kTop + 14, colour, XmlEscape(name));
    ++i;
  }
  return out + "</svg>";
}

}  // namespace stagewise::render
