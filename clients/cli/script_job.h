// TorchScript jobs in the CLI (docs/torchscript.md): the CLI is where the model
// file is known to exist, so it dry-runs the file and tells the coordinator
// (which has no LibTorch) and the workers what the blocks are.
#ifndef STAGEWISE_CLIENTS_CLI_SCRIPT_JOB_H_
#define STAGEWISE_CLIENTS_CLI_SCRIPT_JOB_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/models/block_info.h"
#include "services/spec/job_spec.h"

namespace stagewise::cli {

// For a torchscript job without a script_model section: resolves model.path
// against the job file's folder (when relative), dry-runs the file
// (models::InspectScriptModel) and fills spec->model.script_*; when `yaml` is
// given, appends the same as a script_model section to the job's text, which
// is what gets submitted. Other jobs are left as they are.
absl::Status PrepareScriptModel(const std::string& job_path, JobSpec* spec,
                                std::string* yaml = nullptr);

// A job file's text with the --set assignments applied (OverrideKeys).
absl::StatusOr<std::string> ReadJobText(const std::string& job_path,
                                        const std::vector<std::string>& sets);
// A job file parsed with the --set assignments applied: errors carry the
// file's lines and columns, or "(--set KEY)" for what an assignment wrote.
absl::StatusOr<JobSpec> ParseJobFile(const std::string& job_path,
                                     const std::vector<std::string>& sets);

// A job file as the CLI's offline commands (validate, plan, train-local) open
// it: read, --set applied, parsed, its torchscript model dry-run, and with
// `plan` its blocks and stage ranges. Errors are the parser's, the model's or
// the partition's.
struct JobFile {
  std::string yaml;  // the text as parsed, with the script_model section
  JobSpec spec;
  std::vector<models::BlockInfo> blocks;    // with `plan`
  std::vector<std::pair<int, int>> ranges;  // with `plan`
};
absl::StatusOr<JobFile> OpenJobFile(const std::string& job_path, bool plan,
                                    const std::vector<std::string>& sets = {});

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_SCRIPT_JOB_H_
