// Training curves (`stagewise plot`, `stagewise local --history`): a job's
// loss and accuracy against steps and wall time, read from the coordinator's
// metric history or from a history file, drawn by gnuplot.
#ifndef STAGEWISE_CLIENTS_CLI_CURVES_H_
#define STAGEWISE_CLIENTS_CLI_CURVES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::cli {

struct CurvePoint {
  int64_t step = 0;
  double seconds = 0;  // since the job's first recorded point
  double value = 0;
};

// One job's curves, by metric name: train_loss, eval_loss, eval_accuracy
// (a fraction), samples_per_second.
struct Curves {
  std::string label;  // the legend: "name (algorithm)"
  std::map<std::string, std::vector<CurvePoint>> series;
};

// From a job's status (for its label) and its metric history.
Curves CurvesFromMetrics(const v1::JobStatus& status, const v1::JobMetrics& metrics);

// The history file `local --history` writes: "#" comment lines (the first
// names the job), then "step<TAB>seconds<TAB>name<TAB>value" lines.
std::string HistoryText(const Curves& curves);
absl::StatusOr<Curves> ReadHistoryFile(const std::string& path);

// Draws loss and accuracy against steps and against wall time (2 x 2 panels,
// every job on shared axes) with gnuplot into `output`: .svg or .png.
// Fails naming what is missing (gnuplot itself, any point to draw).
absl::Status PlotCurves(const std::vector<Curves>& jobs, const std::string& output,
                        const std::string& title);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_CURVES_H_
