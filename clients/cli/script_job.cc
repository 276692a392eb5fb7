#include "clients/cli/script_job.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/models/script_model.h"

namespace stagewise::cli {
namespace {

std::string YamlQuoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::Status PrepareScriptModel(const std::string& job_path, JobSpec* spec, std::string* yaml) {
  ModelSpec& model = spec->model;
  if (model.name != "torchscript" || !model.script_blocks.empty()) return absl::OkStatus();
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
    std::string section = absl::StrCat(
        "\n# Added by the stagewise CLI: what a dry run of model.path found.\n"
        "script_model:\n  file: ",
        YamlQuoted(model.script_file), "\n  bytes: ", model.script_bytes, "\n  blocks:\n");
    for (const auto& b : model.script_blocks) {
      absl::StrAppend(&section, "    - {in: ", Shape(b.in_shape), ", out: ", Shape(b.out_shape),
                      ", reversible: ", b.reversible ? "true" : "false",
                      ", parameters: ", b.parameters, "}\n");
    }
    if (!yaml->empty() && yaml->back() != '\n') yaml->push_back('\n');
    yaml->append(section);
  }
  return absl::OkStatus();
}

}  // namespace stagewise::cli
