// Reading YAML nodes into typed values. Every helper returns a status instead
// of letting yaml-cpp's conversions throw, and every error names the key path
// and, for problems in the text, where in the text it is. Internal to
// services/spec/.
#ifndef STAGEWISE_SERVICES_SPEC_YAML_READER_H_
#define STAGEWISE_SERVICES_SPEC_YAML_READER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "services/spec/enums.h"
#include "services/spec/text.h"
#include "yaml-cpp/yaml.h"

namespace stagewise::spec {

// " (line L, column C)" for a node that came from text, "" otherwise.
std::string MarkSuffix(const YAML::Node& node);

// "'text'", "a list", "a map" or "nothing (null)".
std::string Describe(const YAML::Node& node);

// "path: expected <expected>, got <node> (line L, column C)".
absl::Status TypeError(const YAML::Node& node, absl::string_view path, absl::string_view expected);

// A yaml-cpp exception as a user-facing error with the text position.
absl::Status YamlError(const YAML::Exception& e);

absl::Status Convert(const YAML::Node& node, const std::string& path, int64_t* out);
absl::Status Convert(const YAML::Node& node, const std::string& path, int* out);
absl::Status Convert(const YAML::Node& node, const std::string& path, double* out);
absl::Status Convert(const YAML::Node& node, const std::string& path, bool* out);
absl::Status Convert(const YAML::Node& node, const std::string& path, std::string* out);

// A closed set: one of the enum's spellings (enums.h).
template <typename E, typename = decltype(EnumSpellings<E>::kNames)>
absl::Status Convert(const YAML::Node& node, const std::string& path, E* out) {
  if (!node.IsScalar()) return TypeError(node, path, "a string");
  const std::string& text = node.Scalar();
  if (auto value = EnumFromName<E>(text)) {
    *out = *value;
    return absl::OkStatus();
  }
  return KeyError(path, ChoiceMessage(text, EnumNames<E>()));
}

template <typename T>
absl::Status Convert(const YAML::Node& node, const std::string& path, std::vector<T>* out) {
  if (!node.IsSequence()) return TypeError(node, path, "a list");
  std::vector<T> values(node.size());
  for (size_t i = 0; i < node.size(); ++i) {
    absl::Status status = Convert(node[i], absl::StrCat(path, "[", i, "]"), &values[i]);
    if (!status.ok()) return status;
  }
  *out = std::move(values);
  return absl::OkStatus();
}

// One YAML map at a key path. Collects the first error, so a section can be
// read as a flat list of Read() calls followed by one status() check.
class Section {
 public:
  // `node` may be absent or null (= all defaults); anything but a map is an
  // error. `path` is "" for the top level. Duplicate keys are errors.
  Section(const YAML::Node& node, std::string path);

  const absl::Status& status() const { return status_; }
  const std::vector<std::pair<std::string, YAML::Node>>& entries() const { return entries_; }
  std::string PathOf(absl::string_view key) const { return JoinPath(path_, key); }
  const YAML::Node* Find(absl::string_view key) const;

  // Every key must be one of `known`; a typo gets a suggestion.
  void CheckKeys(const std::vector<std::string>& known);

  // Leaves *out untouched (the struct default) when the key is absent.
  template <typename T>
  void Read(absl::string_view key, T* out) {
    if (!status_.ok()) return;
    if (const YAML::Node* node = Find(key)) status_ = Convert(*node, PathOf(key), out);
  }

 private:
  std::string path_;
  std::vector<std::pair<std::string, YAML::Node>> entries_;
  absl::Status status_;
};

}  // namespace stagewise::spec

#endif  // STAGEWISE_SERVICES_SPEC_YAML_READER_H_
