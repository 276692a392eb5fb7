// `stagewise version` and `stagewise metrics-label`: what this binary is, and
// the labels it gives jobs on /metrics.
#include "services/common/version.h"

#include <torch/version.h>

#include <ostream>

#include "absl/strings/str_cat.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "services/metrics/metrics.h"

namespace stagewise::cli {

std::string VersionString() {
  return absl::StrCat("stagewise ", Version(), " (LibTorch ", TORCH_VERSION, ")");
}

void AddVersionCommand(CommandSet& set) {
  set.Add("version", "Print the version and the libraries built in", [](Invocation& run) {
    run.out() << VersionString() << "\n";
    return kExitOk;
  });
}

void AddMetricsLabelCommand(CommandSet& set) {
  struct Args {
    std::vector<std::string> jobs;
    std::string key_file;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      set.Add("metrics-label",
              "Print the job label /metrics uses for each job id under --metrics-job-ids hashed "
              "(to find a job on a dashboard)",
              [args](Invocation& run) {
                absl::StatusOr<metrics::JobLabels> labels =
                    metrics::MakeJobLabels("hashed", args->key_file);
                if (!labels.ok()) {
                  run.err() << "error: " << labels.status().message() << "\n";
                  return kExitInvalid;
                }
                for (const std::string& job : args->jobs) {
                  run.out() << job << " " << labels->Of(job) << "\n";
                }
                return kExitOk;
              });
  cmd->add_option("jobs", args->jobs, "Job ids")->required();
  cmd->add_option("--key-file", args->key_file,
                  "The --metrics-job-key-file of the coordinator and the workers")
      ->required();
}

}  // namespace stagewise::cli
