// `stagewise plot`: training curves of one or more jobs (docs/cli.md).
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/curves.h"
#include "clients/cli/flags.h"
#include "clients/cli/format.h"
#include "clients/cli/job_watch.h"
#include "clients/client/coordinator_client.h"

namespace stagewise::cli {

int Plot(const PlotArgs& args, std::ostream& out, std::ostream& err) {
  std::vector<Curves> jobs;
  std::unique_ptr<client::CoordinatorClient> client;
  for (const std::string& source : args.sources) {
    if (IsFileSource(source)) {
      absl::StatusOr<Curves> curves = ReadHistoryFile(source);
      if (!curves.ok()) {
        err << "error: " << curves.status().message() << "\n";
        return kExitInvalid;
      }
      jobs.push_back(*std::move(curves));
      continue;
    }
    if (client == nullptr) {
      client = std::make_unique<client::CoordinatorClient>(
          client::ResolveCoordinatorAddress(args.coordinator));
    }
    absl::StatusOr<v1::JobStatus> status = client->GetJob(source);
    if (!status.ok()) {
      if (status.status().code() == absl::StatusCode::kNotFound) {
        err << "error: " << source << ": neither a history file nor a job on the coordinator\n";
        return kExitInvalid;
      }
      return ReportError(status.status(), err);
    }
    absl::StatusOr<v1::JobMetrics> metrics = client->GetJobMetrics(source);
    if (!metrics.ok()) return ReportError(metrics.status(), err);
    jobs.push_back(CurvesFromMetrics(*status, *metrics));
  }
  if (absl::Status s = PlotCurves(jobs, args.output, args.title); !s.ok()) {
    err << "error: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? kExitInvalid : kExitFailed;
  }
  out << "wrote " << args.output << " (" << jobs.size() << " job" << (jobs.size() == 1 ? "" : "s")
      << ")\n";
  return kExitOk;
}

void AddPlotCommand(CommandSet& set) {
  auto args = std::make_shared<PlotArgs>();
  auto old_file = std::make_shared<std::unique_ptr<DeprecatedSpelling>>();
  CLI::App* cmd = set.Add(
      "plot",
      "Draw training curves with gnuplot: loss and test accuracy against steps and wall time,\n"
      "every job on shared axes (compare backprop and petra on one picture). A SOURCE is a job\n"
      "id (its history comes from the coordinator) or a file `stagewise local --history`\n"
      "wrote.",
      [args, old_file](Invocation& run) {
        if (!(*old_file)->Apply(args->output, run.err()) ||
            !RequireFlag(args->output, "--output-file", run.err())) {
          return kExitInvalid;
        }
        return run.WithCoordinator([&](const std::string& coordinator) {
          args->coordinator = coordinator;
          return Plot(*args, run.out(), run.err());
        });
      });
  cmd->add_option("sources", args->sources, "Job ids or history files")->required();
  cmd->add_option("--output-file", args->output, "The picture: FILE.svg or FILE.png (required)");
  *old_file = std::make_unique<DeprecatedSpelling>(cmd, "-o,--output", "stagewise plot -o FILE",
                                                   "--output-file FILE");
  cmd->add_option("--title", args->title, "Title above the panels")->capture_default_str();
}

}  // namespace stagewise::cli
