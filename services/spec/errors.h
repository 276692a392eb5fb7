// Job-spec errors that point: every error gets the line and column of the
// key it names (or of the nearest enclosing key the document has), or
// "(--set KEY)" when a --set assignment wrote it; and a document is parsed
// again without each offending key so that all its errors are reported at
// once (at most kMaxSpecErrors). Internal to services/spec/.
#ifndef STAGEWISE_SERVICES_SPEC_ERRORS_H_
#define STAGEWISE_SERVICES_SPEC_ERRORS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/spec/job_spec.h"
#include "yaml-cpp/yaml.h"

namespace stagewise::spec {

inline constexpr int kMaxSpecErrors = 20;

// The key path an error message starts with ("optimizer.lr" of
// "optimizer.lr: must be positive"); "" when it names none.
std::string ErrorPath(const std::string& message);

// `message` with where it points: " (line L, column C)" of the key `path`
// names in `root` (the deepest that exists), or " (--set KEY)" when `path` is
// at or under one of `set_paths`. Unchanged when it already says where.
std::string Locate(const std::string& message, const YAML::Node& root,
                   const std::vector<std::string>& set_paths);

// Removes the key `path` names from `root`; false when it is not there.
bool RemoveKey(YAML::Node root, const std::string& path);

// Parses `root` with `parse`; on an error, locates it, removes the key it
// names and parses again, until the document parses, an error names no key
// of the document (or one under a key already removed: a consequence), or
// kMaxSpecErrors. One error keeps its single-line form; several are
// "N errors in the job spec:" and one per line.
absl::StatusOr<JobSpec> ParseReportingAll(
    YAML::Node root, const std::vector<std::string>& set_paths,
    const std::function<absl::StatusOr<JobSpec>(const YAML::Node&)>& parse);

}  // namespace stagewise::spec

#endif  // STAGEWISE_SERVICES_SPEC_ERRORS_H_
