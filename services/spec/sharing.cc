#include "services/spec/sharing.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/status_macros.h"
#include "services/spec/job_spec.h"
#include "services/spec/text.h"
#include "services/spec/yaml_reader.h"

namespace stagewise {
namespace {

using spec::KeyError;
using spec::Section;

absl::Status ReadOwner(const YAML::Node& node, const std::string& path, int pool_workers,
                       SharingConfig::Owner* owner) {
  Section s(node, path);
  s.CheckKeys({"weight", "max_workers", "max_running_jobs"});
  s.Read("weight", &owner->weight);
  s.Read("max_workers", &owner->max_workers);
  s.Read("max_running_jobs", &owner->max_running_jobs);
  if (!s.status().ok()) return s.status();
  owner->keys.clear();
  for (const auto& [key, value] : s.entries()) owner->keys.insert(key);
  if (!(owner->weight > 0) || !std::isfinite(owner->weight)) {
    return KeyError(s.PathOf("weight"), absl::StrCat("must be a number > 0, got ", owner->weight));
  }
  if (owner->max_workers < 0) {
    return KeyError(s.PathOf("max_workers"),
                    absl::StrCat("must be >= 0 (0: no limit), got ", owner->max_workers));
  }
  if (owner->max_running_jobs < 0) {
    return KeyError(s.PathOf("max_running_jobs"),
                    absl::StrCat("must be >= 0 (0: no limit), got ", owner->max_running_jobs));
  }
  if (pool_workers > 0 && owner->max_workers > pool_workers) {
    return KeyError(s.PathOf("max_workers"),
                    absl::StrCat(owner->max_workers, " is more than the pool's ", pool_workers,
                                 " workers (pool_workers)"));
  }
  return absl::OkStatus();
}

absl::Status ReadClasses(const YAML::Node& node, SharingConfig* config) {
  if (!node.IsSequence()) return spec::TypeError(node, "classes", "a list of classes");
  std::set<std::string> seen;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = absl::StrCat("classes[", i, "]");
    SharingConfig::Class c;
    if (node[i].IsScalar()) {
      c.name = node[i].Scalar();
    } else {
      Section s(node[i], path);
      s.CheckKeys({"name", "preempt", "owners"});
      s.Read("name", &c.name);
      s.Read("preempt", &c.preempt);
      s.Read("owners", &c.owners);
      if (!s.status().ok()) return s.status();
    }
    if (c.name.empty() || c.name.find_first_of(" \t\n,") != std::string::npos) {
      return KeyError(absl::StrCat(path, ".name"),
                      absl::StrCat("a class needs a name without spaces or commas, got '",
                                   spec::Clip(c.name), "'"));
    }
    if (!seen.insert(c.name).second) {
      return KeyError(absl::StrCat(path, ".name"),
                      absl::StrCat("class '", c.name, "' is listed twice"));
    }
    config->classes.push_back(std::move(c));
  }
  return absl::OkStatus();
}

std::vector<std::string> ClassNames(const SharingConfig& config) {
  std::vector<std::string> names;
  for (const SharingConfig::Class& c : config.classes) names.push_back(c.name);
  return names;
}

}  // namespace

std::string OwnerKey(const std::string& owner) { return owner.empty() ? "anonymous" : owner; }

const SharingConfig::Owner& SharingConfig::OwnerOf(const std::string& owner) const {
  auto it = owners.find(OwnerKey(owner));
  return it == owners.end() ? default_owner : it->second;
}

absl::StatusOr<int> SharingConfig::RankOf(const std::string& class_name,
                                          const std::string& key) const {
  const std::string& name = class_name.empty() ? default_class : class_name;
  if (classes.empty()) {
    if (name.empty()) return 0;
    return absl::NotFoundError(
        absl::StrCat(key, ": unknown class '", spec::Clip(name),
                     "': this coordinator has no priority classes (stagewise-coordinator "
                     "--scheduling-config)"));
  }
  for (size_t i = 0; i < classes.size(); ++i) {
    if (classes[i].name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(absl::StrCat(key, ": unknown class '", spec::Clip(name),
                                          "'; this coordinator's classes are ",
                                          absl::StrJoin(ClassNames(*this), ", ")));
}

absl::Status SharingConfig::CheckOpenTo(int rank, const std::string& owner) const {
  if (rank < 0 || rank >= static_cast<int>(classes.size())) return absl::OkStatus();
  const std::vector<std::string>& open = classes[rank].owners;
  if (open.empty() || std::find(open.begin(), open.end(), OwnerKey(owner)) != open.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "priority: class ", classes[rank].name, " is open to ", absl::StrJoin(open, ", "),
      " only, not to ", OwnerKey(owner), " (classes[", rank, "].owners)"));
}

std::string SharingConfig::QuotaKey(const std::string& owner, const std::string& field) const {
  auto it = owners.find(OwnerKey(owner));
  if (it != owners.end() && it->second.keys.count(field)) {
    return absl::StrCat("owners.", OwnerKey(owner), ".", field);
  }
  return absl::StrCat("default_owner.", field);
}

std::string SharingConfig::NameOf(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(classes.size())) return "";
  return classes[rank].name;
}

bool SharingConfig::Preempts(int rank) const {
  return rank >= 0 && rank < static_cast<int>(classes.size()) && classes[rank].preempt;
}

absl::Status CheckJobAgainst(const SharingConfig& config, const JobSpec& spec,
                             const std::string& owner) {
  absl::StatusOr<int> rank = config.RankOf(spec.priority);
  if (!rank.ok()) return absl::InvalidArgumentError(rank.status().message());
  STAGEWISE_RETURN_IF_ERROR(config.CheckOpenTo(*rank, owner));
  const int quota = config.OwnerOf(owner).max_workers;
  if (quota <= 0) return absl::OkStatus();
  // A job's first placement takes all of its workers (fewer only when it
  // recovers).
  const int workers = spec.stages.count * std::max(1, spec.stages.replicas);
  if (workers <= quota) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("stages: the job needs ", workers, " workers, but ", OwnerKey(owner),
                   " may hold at most ", quota, " (the coordinator's scheduling config, ",
                   config.QuotaKey(owner, "max_workers"), ")"));
}

absl::StatusOr<SharingConfig> ParseSharingConfig(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return spec::YamlError(e);
  }
  SharingConfig config;
  Section top(root, "");
  top.CheckKeys(
      {"classes", "default_class", "owners", "default_owner", "pool_workers", "fair_share"});
  top.Read("default_class", &config.default_class);
  top.Read("pool_workers", &config.pool_workers);
  if (!top.status().ok()) return top.status();
  if (config.pool_workers < 0) {
    return KeyError("pool_workers",
                    absl::StrCat("must be >= 0 (0: not declared), got ", config.pool_workers));
  }
  if (const YAML::Node* classes = top.Find("classes")) {
    if (absl::Status s = ReadClasses(*classes, &config); !s.ok()) return s;
  }
  if (config.classes.empty() && !config.default_class.empty()) {
    return KeyError("default_class", "names a class, but `classes` lists none");
  }
  if (config.default_class.empty() && !config.classes.empty()) {
    config.default_class = config.classes.back().name;
  }
  if (absl::StatusOr<int> rank = config.RankOf(config.default_class, "default_class"); !rank.ok()) {
    return absl::InvalidArgumentError(rank.status().message());
  }
  if (const YAML::Node* node = top.Find("default_owner")) {
    if (absl::Status s =
            ReadOwner(*node, "default_owner", config.pool_workers, &config.default_owner);
        !s.ok()) {
      return s;
    }
  }
  if (const YAML::Node* node = top.Find("owners")) {
    Section owners(*node, "owners");
    if (!owners.status().ok()) return owners.status();
    for (const auto& [name, value] : owners.entries()) {
      SharingConfig::Owner owner = config.default_owner;
      if (absl::Status s = ReadOwner(value, owners.PathOf(name), config.pool_workers, &owner);
          !s.ok()) {
        return s;
      }
      config.owners[name] = owner;
    }
  }
  if (const YAML::Node* node = top.Find("fair_share")) {
    Section s(*node, "fair_share");
    s.CheckKeys({"half_life_seconds"});
    s.Read("half_life_seconds", &config.half_life_seconds);
    if (!s.status().ok()) return s.status();
    if (!(config.half_life_seconds > 0) || !std::isfinite(config.half_life_seconds)) {
      return KeyError("fair_share.half_life_seconds",
                      absl::StrCat("must be a number > 0, got ", config.half_life_seconds));
    }
  }
  return config;
}

absl::StatusOr<SharingConfig> LoadSharingConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<SharingConfig> config = ParseSharingConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace stagewise
