#include "services/spec/errors.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stagewise::spec {
namespace {

// "phases[1].algorithm.name" -> {"phases", "[1]", "algorithm", "name"}.
std::vector<std::string> PathParts(const std::string& path) {
  std::vector<std::string> parts;
  std::string current;
  for (const char c : path) {
    if (c == '.' || c == '[') {
      if (!current.empty()) parts.push_back(current);
      current = c == '[' ? "[" : "";
    } else {
      current.push_back(c);
      if (c == ']') {
        parts.push_back(current);
        current.clear();
      }
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

// The child of `node` named `part` ("key" or "[i]"), and the mark of its key
// (a list item: its own). False when there is none.
bool Child(const YAML::Node& node, const std::string& part, YAML::Node* child, YAML::Mark* mark) {
  if (absl::StartsWith(part, "[")) {
    size_t i = 0;
    if (!node.IsSequence() || !absl::SimpleAtoi(part.substr(1, part.size() - 2), &i) ||
        i >= node.size()) {
      return false;
    }
    *child = node[i];
    *mark = child->Mark();
    return true;
  }
  if (!node.IsMap()) return false;
  for (const auto& kv : node) {
    if (kv.first.IsScalar() && kv.first.Scalar() == part) {
      *child = kv.second;
      *mark = kv.first.Mark();
      return true;
    }
  }
  return false;
}

// "data.dataset" -> "data", "phases[1]" -> "phases", "name" -> "".
std::string Parent(const std::string& path) {
  const size_t at = path.find_last_of(".[");
  return at == std::string::npos ? "" : path.substr(0, at);
}

bool HasKey(const YAML::Node& root, const std::string& path) {
  YAML::Node node = root;
  for (const std::string& part : PathParts(path)) {
    YAML::Node child;
    YAML::Mark mark;
    if (!Child(node, part, &child, &mark)) return false;
    node.reset(child);
  }
  return !path.empty();
}

bool Under(const std::string& path, const std::string& prefix) {
  return path == prefix || absl::StartsWith(path, prefix + ".") ||
         absl::StartsWith(path, prefix + "[");
}

}  // namespace

std::string ErrorPath(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  const std::string path = message.substr(0, colon);
  for (const char c : path) {
    if (!(absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '[' || c == ']' || c == '-')) {
      return "";
    }
  }
  return path;
}

std::string Locate(const std::string& message, const YAML::Node& root,
                   const std::vector<std::string>& set_paths) {
  const std::string path = ErrorPath(message);
  for (const std::string& set : set_paths) {
    if (path.empty() || !(Under(path, set) || Under(set, path))) continue;
    // What an assignment wrote: its marks are in the assignment's own text.
    std::string text = message;
    if (const size_t at = text.rfind(" (line "); at != std::string::npos && text.back() == ')') {
      text.resize(at);
    }
    return absl::StrCat(text, " (--set ", set, ")");
  }
  if (absl::StrContains(message, " (line ") || absl::StartsWith(message, "line ")) return message;
  if (path.empty()) return message;
  YAML::Node node = root;
  YAML::Mark mark = YAML::Mark::null_mark();
  for (const std::string& part : PathParts(path)) {
    YAML::Node child;
    YAML::Mark child_mark;
    if (!Child(node, part, &child, &child_mark)) break;
    node.reset(child);
    mark = child_mark;
  }
  if (mark.is_null()) {
    // A top-level key the document lacks: the document's start.
    if (!root.IsMap() || root.Mark().is_null()) return message;
    mark = root.Mark();
  }
  return absl::StrFormat("%s (line %d, column %d)", message, mark.line + 1, mark.column + 1);
}

bool RemoveKey(YAML::Node root, const std::string& path) {
  std::vector<std::string> parts = PathParts(path);
  if (parts.empty()) return false;
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node child;
    YAML::Mark mark;
    if (!Child(node, parts[i], &child, &mark)) return false;
    node.reset(child);
  }
  const std::string& last = parts.back();
  if (absl::StartsWith(last, "[")) {
    size_t i = 0;
    if (!node.IsSequence() || !absl::SimpleAtoi(last.substr(1, last.size() - 2), &i) ||
        i >= node.size()) {
      return false;
    }
    // Replaced by null rather than removed: the other items keep their index.
    node[i] = YAML::Node(YAML::NodeType::Null);
    return true;
  }
  if (!node.IsMap() || !node[last].IsDefined()) return false;
  return node.remove(last);
}

absl::StatusOr<JobSpec> ParseReportingAll(
    YAML::Node root, const std::vector<std::string>& set_paths,
    const std::function<absl::StatusOr<JobSpec>(const YAML::Node&)>& parse) {
  std::vector<std::string> errors;
  std::vector<std::string> removed;
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  bool more = false;
  while (true) {
    absl::StatusOr<JobSpec> spec = parse(root);
    if (spec.ok()) {
      if (errors.empty()) return spec;
      break;
    }
    const std::string message(spec.status().message());
    const std::string path = ErrorPath(message);
    // After a removal, an error about a key the document does not have (a
    // default that no longer fits, e.g. resnet's depth once its blocks went)
    // is a consequence, not the user's. A required key is the user's to
    // add, unless a key of the same map was just removed (a misspelling of
    // it: `datset` for `dataset`).
    bool consequence = false;
    for (const std::string& r : removed) consequence |= Under(path, r);
    if (!errors.empty() && !HasKey(root, path)) {
      bool sibling_removed = false;
      for (const std::string& r : removed) sibling_removed |= Parent(r) == Parent(path);
      if (!absl::StrContains(message, ": required") || sibling_removed) consequence = true;
    }
    if (!errors.empty() && (path.empty() || consequence)) break;
    if (errors.empty()) code = spec.status().code();
    if (static_cast<int>(errors.size()) == kMaxSpecErrors) {
      more = true;
      break;
    }
    errors.push_back(Locate(message, root, set_paths));
    if (path.empty() || !RemoveKey(root, path)) break;
    removed.push_back(path);
  }
  if (errors.size() == 1) return absl::Status(code, errors.front());
  return absl::Status(
      code,
      absl::StrCat(errors.size(), more ? "+" : "", " errors in the job spec:\n  ",
                   absl::StrJoin(errors, "\n  "), more ? "\n  (and more; fix these first)" : ""));
}

}  // namespace stagewise::spec
