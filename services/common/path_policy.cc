#include "services/common/path_policy.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/utf8.h"
#include "services/spec/job_spec.h"

namespace stagewise {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxPathBytes = 4096;

// The path absolute and resolved as far as it exists, or an error text.
bool Resolve(const std::string& path, fs::path* out, std::string* why) {
  std::error_code ec;
  fs::path absolute = fs::absolute(fs::path(path), ec);
  if (ec) {
    *why = ec.message();
    return false;
  }
  fs::path resolved = fs::weakly_canonical(absolute, ec);
  if (ec) {
    *why = ec.message();
    return false;
  }
  *out = resolved.lexically_normal();
  return true;
}

// Whether `path` is `root` or lies below it, component by component (so
// /data2 is not inside /data).
bool Inside(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r) {
    if (r->empty()) continue;  // the trailing "" of "/data/"
    if (p == path.end() || *p != *r) return false;
    ++p;
  }
  return true;
}

// Keeps a hostile value from flooding an error message.
std::string Shown(const std::string& value) {
  constexpr size_t kShown = 200;
  if (value.size() <= kShown) return std::string(value);
  return absl::StrCat(Utf8Prefix(value, kShown), "... (", value.size(), " bytes)");
}

}  // namespace

absl::StatusOr<std::string> ConfinePath(const std::string& key, const std::string& value,
                                        const PathRoots& policy) {
  if (!policy.confine || value.empty()) return value;
  if (value.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": ", value.size(), " bytes is longer than the ", kMaxPathBytes, " a path may have"));
  }
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": a path must not contain control characters"));
    }
  }
  const std::string& text = value;
  for (const auto& part : fs::path(text)) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(key, ": '", Shown(value),
                                                     "' has a '..' component; give a path inside ",
                                                     policy.flag, " without one"));
    }
  }
  if (policy.roots.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": '", Shown(value), "' refused: this process was started without ",
                     policy.flag, ", so it accepts no ", key, " (start it with ", policy.flag,
                     " DIR to allow paths under DIR)"));
  }
  fs::path resolved;
  std::string why;
  if (!Resolve(text, &resolved, &why)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": cannot resolve '", Shown(value), "': ", why));
  }
  for (const std::string& root : policy.roots) {
    fs::path resolved_root;
    if (!Resolve(root, &resolved_root, &why)) continue;
    if (Inside(resolved, resolved_root)) return resolved.string();
  }
  const bool escaped_by_link = [&] {
    // Inside a root as written, outside once symlinks are followed.
    std::error_code ec;
    const fs::path literal = fs::absolute(fs::path(text), ec).lexically_normal();
    if (ec) return false;
    for (const std::string& root : policy.roots) {
      if (Inside(literal, fs::absolute(fs::path(root), ec).lexically_normal())) return true;
    }
    return false;
  }();
  return absl::InvalidArgumentError(absl::StrCat(
      key, ": '", Shown(value), "'", escaped_by_link ? " leads through a symlink to '" : " is '",
      Shown(resolved.string()), "', outside ", policy.flag, " (", absl::StrJoin(policy.roots, ", "),
      ")"));
}

absl::Status ConfineModelFile(ModelSpec* model, const PathRoots& policy) {
  if (model->name != ModelKind::kTorchScript) return absl::OkStatus();
  const bool inspected = !model->script_file.empty();
  auto file = ConfinePath(inspected ? "script_model.file" : "model.path",
                          inspected ? model->script_file : model->path, policy);
  if (!file.ok()) return file.status();
  model->script_file = *file;
  return absl::OkStatus();
}

}  // namespace stagewise
