#include "services/spec/yaml_reader.h"

#include <limits>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stagewise::spec {

std::string MarkSuffix(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return absl::StrFormat(" (line %d, column %d)", mark.line + 1, mark.column + 1);
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing (null)";
}

absl::Status TypeError(const YAML::Node& node, absl::string_view path, absl::string_view expected) {
  return KeyError(path,
                  absl::StrCat("expected ", expected, ", got ", Describe(node), MarkSuffix(node)));
}

absl::Status YamlError(const YAML::Exception& e) {
  if (e.mark.is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML: ", e.msg));
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("line %d, column %d: %s", e.mark.line + 1, e.mark.column + 1, e.msg));
}

absl::Status Convert(const YAML::Node& node, const std::string& path, int64_t* out) {
  if (!node.IsScalar() || !ParseIntText(node.Scalar(), out)) {
    return TypeError(node, path, "an integer");
  }
  return absl::OkStatus();
}

absl::Status Convert(const YAML::Node& node, const std::string& path, int* out) {
  int64_t wide = 0;
  if (!node.IsScalar() || !ParseIntText(node.Scalar(), &wide)) {
    return TypeError(node, path, "an integer");
  }
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max()) {
    return TypeError(node, path, "an integer that fits in 32 bits");
  }
  *out = static_cast<int>(wide);
  return absl::OkStatus();
}

absl::Status Convert(const YAML::Node& node, const std::string& path, double* out) {
  if (!node.IsScalar() || !ParseDoubleText(node.Scalar(), out)) {
    return TypeError(node, path, "a number");
  }
  return absl::OkStatus();
}

absl::Status Convert(const YAML::Node& node, const std::string& path, bool* out) {
  if (!node.IsScalar() || !ParseBoolText(node.Scalar(), out)) {
    return TypeError(node, path, "a boolean (true or false)");
  }
  return absl::OkStatus();
}

absl::Status Convert(const YAML::Node& node, const std::string& path, std::string* out) {
  if (!node.IsScalar()) return TypeError(node, path, "a string");
  *out = node.Scalar();
  return absl::OkStatus();
}

Section::Section(const YAML::Node& node, std::string path) : path_(std::move(path)) {
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsMap()) {
    status_ = path_.empty() ? absl::InvalidArgumentError(absl::StrCat(
                                  "job spec: expected a map of keys at the top level, got ",
                                  Describe(node), MarkSuffix(node)))
                            : TypeError(node, path_, "a map");
    return;
  }
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      status_ = TypeError(entry.first, JoinPath(path_, "<key>"), "a plain key");
      return;
    }
    const std::string key = entry.first.Scalar();
    // yaml-cpp keeps duplicate keys and lookups see only the first, so a
    // second "lr:" further down would be silently ignored.
    if (Find(key) != nullptr) {
      status_ =
          KeyError(JoinPath(path_, key), absl::StrCat("duplicate key", MarkSuffix(entry.first)));
      return;
    }
    entries_.emplace_back(key, entry.second);
  }
}

const YAML::Node* Section::Find(absl::string_view key) const {
  for (const auto& [name, value] : entries_) {
    if (name == key) return &value;
  }
  return nullptr;
}

void Section::CheckKeys(const std::vector<std::string>& known) {
  if (!status_.ok()) return;
  for (const auto& [key, value] : entries_) {
    if (Contains(known, key)) continue;
    std::string message = "unknown key";
    if (auto suggestion = Suggest(key, known)) {
      absl::StrAppend(&message, " (did you mean ", PathOf(*suggestion), "?)");
    } else {
      absl::StrAppend(&message, " (known: ", absl::StrJoin(known, ", "), ")");
    }
    status_ = KeyError(PathOf(Clip(key)), message);
    return;
  }
}

}  // namespace stagewise::spec
