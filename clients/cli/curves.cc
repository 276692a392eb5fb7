#include "clients/cli/curves.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "clients/cli/process.h"

namespace stagewise::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kHistoryHeader[] = "# stagewise history: ";

// A string as a gnuplot single-quoted literal ('' stands for one quote).
std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += '\'';
    if (c == '\n' || c == '\r') c = ' ';
    out += c;
  }
  return out + "'";
}

// gnuplot's enhanced text treats _ ^ @ & { } as markup: escape them in labels.
std::string Plain(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '_' || c == '^' || c == '@' || c == '&' || c == '{' || c == '}') out += '\\';
    out += c;
  }
  return out;
}

// A string as one shell word.
std::string ShellQuoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace

Curves CurvesFromMetrics(const v1::JobStatus& status, const v1::JobMetrics& metrics) {
  Curves c;
  c.label = status.algorithm().empty() ? status.name()
                                       : absl::StrCat(status.name(), " (", status.algorithm(), ")");
  // Wall time counts from the job's first start (its first attempt), or
  // else from its first recorded point.
  int64_t start_ms = status.attempts_size() > 0 ? status.attempts(0).started_unix_ms() : 0;
  for (const auto& s : metrics.samples()) {
    if (start_ms == 0 || s.unix_ms() < start_ms) start_ms = s.unix_ms();
  }
  for (const auto& s : metrics.samples()) {
    if (!std::isfinite(s.value())) continue;
    c.series[s.name()].push_back(
        {s.step(), static_cast<double>(s.unix_ms() - start_ms) / 1000.0, s.value()});
  }
  return c;
}

std::string HistoryText(const Curves& curves) {
  std::string out = absl::StrCat(kHistoryHeader, curves.label, "\n# step\tseconds\tname\tvalue\n");
  for (const auto& [name, points] : curves.series) {
    for (const CurvePoint& p : points) {
      absl::StrAppend(&out, p.step, "\t", absl::StrFormat("%.3f", p.seconds), "\t", name, "\t",
                      absl::StrFormat("%.9g", p.value), "\n");
    }
  }
  return out;
}

absl::StatusOr<Curves> ReadHistoryFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read the file"));
  Curves c;
  c.label = fs::path(path).stem().string();
  std::string line;
  int number = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++number;
    if (absl::StartsWith(line, kHistoryHeader)) {
      c.label = std::string(absl::StripAsciiWhitespace(line.substr(sizeof(kHistoryHeader) - 1)));
      header = true;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    CurvePoint p;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &p.step) || !absl::SimpleAtod(f[1], &p.seconds) ||
        f[2].empty() || !absl::SimpleAtod(f[3], &p.value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number,
                       ": expected step<TAB>seconds<TAB>name<TAB>value (a history file "
                       "written by `stagewise local --history`)"));
    }
    c.series[f[2]].push_back(p);
  }
  if (!header && c.series.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a history file (`stagewise local --history FILE` writes one)"));
  }
  return c;
}

absl::Status PlotCurves(const std::vector<Curves>& jobs, const std::string& output,
                        const std::string& title) {
  const std::string ext = fs::path(output).extension().string();
  if (ext != ".svg" && ext != ".png") {
    return absl::InvalidArgumentError(
        absl::StrCat("-o ", output, ": the picture must be a .svg or a .png file"));
  }
  auto gnuplot = FindExecutable("gnuplot", "");
  if (!gnuplot.ok()) {
    return absl::FailedPreconditionError(
        "gnuplot not found: install Debian's gnuplot-nox (scripts/setup does)");
  }
  bool any = false;
  for (const Curves& c : jobs) {
    for (const char* name : {"train_loss", "eval_loss", "eval_accuracy"}) {
      auto it = c.series.find(name);
      any = any || (it != c.series.end() && !it->second.empty());
    }
  }
  if (!any) {
    return absl::FailedPreconditionError(
        "nothing to draw: no job has a recorded training loss or evaluation yet");
  }
  std::error_code ec;
  std::string pattern = (fs::temp_directory_path() / "stagewise-plot-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, "cannot make a temporary directory for gnuplot");
  }
  const fs::path dir(pattern);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(dir, e);
    }
  } cleanup{dir};

  // One data file per job and metric: step, seconds, value (accuracy in %).
  auto data = [&](size_t j, const std::string& name) -> std::string {
    auto it = jobs[j].series.find(name);
    if (it == jobs[j].series.end() || it->second.empty()) return "";
    const fs::path file = dir / absl::StrCat("job", j, "_", name, ".dat");
    std::ofstream out(file);
    std::vector<CurvePoint> points = it->second;
    std::stable_sort(points.begin(), points.end(),
                     [](const CurvePoint& a, const CurvePoint& b) { return a.step < b.step; });
    const double scale = name == "eval_accuracy" ? 100.0 : 1.0;
    for (const CurvePoint& p : points) {
      out << p.step << ' ' << p.seconds << ' ' << p.value * scale << '\n';
    }
    return file.string();
  };
  // Shared x ranges, so that a job's single final evaluation sits at its end
  // rather than alone in the middle of a panel.
  int64_t max_step = 1;
  double max_seconds = 1;
  for (const Curves& c : jobs) {
    for (const auto& [name, points] : c.series) {
      for (const CurvePoint& p : points) {
        max_step = std::max(max_step, p.step);
        max_seconds = std::max(max_seconds, p.seconds);
      }
    }
  }
  std::ostringstream gp;
  gp << (ext == ".svg" ? "set terminal svg size 1200,800 dynamic enhanced font 'Sans,12' "
                         "background rgb 'white'\n"
                       : "set terminal pngcairo size 1200,800 enhanced font 'Sans,11'\n");
  gp << "set output " << Quoted(output) << "\n";
  gp << "set multiplot layout 2,2 title " << Quoted(Plain(title)) << " font ',14'\n";
  gp << "set grid\nset datafile separator ' '\n";
  struct Panel {
    std::string x_label, y_label;
    int x_column;
    std::vector<std::string> names;  // train first, then eval, as line styles
  };
  const std::vector<Panel> panels = {
      {"step", "loss", 1, {"train_loss", "eval_loss"}},
      {"step", "test accuracy (%)", 1, {"eval_accuracy"}},
      {"wall time (s)", "loss", 2, {"train_loss", "eval_loss"}},
      {"wall time (s)", "test accuracy (%)", 2, {"eval_accuracy"}},
  };
  for (const Panel& panel : panels) {
    gp << "set xlabel " << Quoted(panel.x_label) << "\nset ylabel " << Quoted(panel.y_label)
       << "\nset xrange [0:"
       << (panel.x_column == 1 ? absl::StrFormat("%.0f", 1.02 * static_cast<double>(max_step))
                               : absl::StrFormat("%.3f", 1.02 * max_seconds))
       << "]\nset autoscale y\n";
    // Losses fall and accuracies rise: each panel's legend goes where its
    // curves are not, with room made for it (offsets: left, right, top, bottom).
    if (panel.y_label == "loss") {
      gp << "set key top right box opaque\nset offsets 0, 0, graph 0.4, graph 0.02\n";
    } else {
      gp << "set key bottom right box opaque\nset offsets 0, 0, graph 0.05, graph 0.4\n";
    }
    std::vector<std::string> plots;
    for (size_t j = 0; j < jobs.size(); ++j) {
      for (const std::string& name : panel.names) {
        const std::string file = data(j, name);
        if (file.empty()) continue;
        const bool eval = name != "train_loss";
        std::string what = jobs[j].label;
        if (panel.names.size() > 1) absl::StrAppend(&what, eval ? ", test" : ", train");
        plots.push_back(absl::StrCat(Quoted(file), " using ", panel.x_column, ":3 with ",
                                     eval ? "linespoints pt 7 ps 0.6" : "lines", " lw 1.5 lc ",
                                     j + 1, eval && panel.names.size() > 1 ? " dt 2" : "",
                                     " title ", Quoted(Plain(what))));
      }
    }
    if (plots.empty()) {
      gp << "set label 1 'nothing recorded' at graph 0.5,0.5 center\n"
            "set yrange [0:1]\nplot -1 notitle\nunset label 1\n";
      continue;
    }
    gp << "plot " << absl::StrJoin(plots, ", \\\n     ") << "\n";
  }
  gp << "unset multiplot\nset output\n";
  const fs::path script = dir / "curves.gp";
  std::ofstream(script) << gp.str();
  const fs::path log = dir / "gnuplot.log";
  const std::string cmd = absl::StrCat(ShellQuoted(*gnuplot), " ", ShellQuoted(script.string()),
                                       " >", ShellQuoted(log.string()), " 2>&1 </dev/null");
  const int status = std::system(cmd.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !fs::exists(output, ec)) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return absl::InternalError(absl::StrCat("gnuplot failed (", DescribeWaitStatus(status),
                                            "): ", text.str().substr(0, 2000)));
  }
  return absl::OkStatus();
}

}  // namespace stagewise::cli
