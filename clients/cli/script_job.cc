#include "clients/cli/script_job.h"

#include <filesystem>
#include <system_error>

#include "services/common/status_macros.h"
#include "services/models/plan.h"
#include "services/models/script_model.h"

namespace stagewise::cli {

absl::Status PrepareScriptModel(const std::string& job_path, JobSpec* spec, std::string* yaml) {
  ModelSpec& model = spec->model;
  if (model.name != ModelKind::kTorchScript || !model.script_blocks.empty())
    return absl::OkStatus();
  namespace fs = std::filesystem;
  fs::path file(model.path);
  if (file.is_relative()) file = fs::path(job_path).parent_path() / file;
  std::error_code ec;
  fs::path absolute = fs::absolute(file, ec).lexically_normal();
  if (ec) absolute = file;
  model.script_file = absolute.string();
  const auto size = fs::file_size(absolute, ec);
  model.script_bytes = ec ? 0 : static_cast<int64_t>(size);
  auto blocks = models::InspectScriptModel(model);
  if (!blocks.ok()) return blocks.status();
  model.script_blocks = *std::move(blocks);
  if (yaml != nullptr) {
    if (!yaml->empty() && yaml->back() != '\n') yaml->push_back('\n');
    yaml->append(models::ScriptModelSection(model));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadJobText(const std::string& job_path,
                                        const std::vector<std::string>& sets) {
  STAGEWISE_ASSIGN_OR_RETURN(std::string text, ReadJobFile(job_path));
  return OverrideKeys(text, sets);
}

absl::StatusOr<JobSpec> ParseJobFile(const std::string& job_path,
                                     const std::vector<std::string>& sets) {
  STAGEWISE_ASSIGN_OR_RETURN(std::string text, ReadJobFile(job_path));
  return ParseJobSpec(text, sets);
}

absl::StatusOr<JobFile> OpenJobFile(const std::string& job_path, bool plan,
                                    const std::vector<std::string>& sets) {
  JobFile file;
  STAGEWISE_ASSIGN_OR_RETURN(std::string text, ReadJobFile(job_path));
  STAGEWISE_ASSIGN_OR_RETURN(file.spec, ParseJobSpec(text, sets));
  STAGEWISE_ASSIGN_OR_RETURN(file.yaml, OverrideKeys(text, sets));
  STAGEWISE_RETURN_IF_ERROR(PrepareScriptModel(job_path, &file.spec, &file.yaml));
  if (!plan) return file;
  STAGEWISE_ASSIGN_OR_RETURN(file.blocks, models::PlanModel(file.spec.model));
  STAGEWISE_ASSIGN_OR_RETURN(file.ranges, models::ResolvePartition(file.spec.stages, file.blocks));
  return file;
}

}  // namespace stagewise::cli
