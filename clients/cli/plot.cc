// `stagewise plot`: training curves of one or more jobs (docs/cli.md).
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clients/cli/commands.h"
#include "clients/cli/curves.h"
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

}  // namespace stagewise::cli
