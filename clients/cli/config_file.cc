#include "clients/cli/config_file.h"

#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace stagewise::cli {
namespace {

namespace fs = std::filesystem;

std::string Home() {
  const char* home = std::getenv("HOME");
  return home != nullptr ? home : "";
}

// "~/x" -> "$HOME/x"; anything else as it is.
std::string ExpandHome(const std::string& path) {
  if (path.rfind("~/", 0) == 0 && !Home().empty()) return Home() + path.substr(1);
  return path;
}

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

}  // namespace

std::string ConfigPath() {
  if (const char* p = std::getenv("STAGEWISE_CONFIG"); p != nullptr && *p != '\0') return p;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x != nullptr && *x != '\0') {
    return absl::StrCat(x, "/stagewise/config.yaml");
  }
  return absl::StrCat(Home(), "/.config/stagewise/config.yaml");
}

absl::StatusOr<CliConfig> LoadConfig(const std::string& path) {
  CliConfig config;
  if (!fs::exists(path)) return config;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return Bad(path, absl::StrCat("not YAML: ", e.what()));
  }
  if (root.IsNull()) return config;
  if (!root.IsMap()) return Bad(path, "expected a map with current-context and contexts");
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key == "current-context") {
      if (!kv.second.IsScalar()) return Bad(path, "current-context: expected a name");
      config.current_context = kv.second.as<std::string>();
    } else if (key == "contexts") {
      if (kv.second.IsNull()) continue;
      if (!kv.second.IsMap()) return Bad(path, "contexts: expected a map of name: {...}");
      for (const auto& c : kv.second) {
        const std::string name = c.first.as<std::string>();
        const std::string where = absl::StrCat("contexts.", name);
        if (!c.second.IsMap()) return Bad(path, absl::StrCat(where, ": expected a map"));
        Context& ctx = config.contexts[name];
        for (const auto& f : c.second) {
          const std::string field = f.first.as<std::string>();
          if (!f.second.IsScalar()) {
            return Bad(path, absl::StrCat(where, ".", field, ": expected a value"));
          }
          const std::string value = f.second.as<std::string>();
          if (field == "coordinator") {
            ctx.coordinator = value;
          } else if (field == "token-file") {
            ctx.token_file = ExpandHome(value);
          } else if (field == "tls-ca") {
            ctx.tls_ca = ExpandHome(value);
          } else if (field == "tls-cert") {
            ctx.tls_cert = ExpandHome(value);
          } else if (field == "tls-key") {
            ctx.tls_key = ExpandHome(value);
          } else if (field == "tls-server-name") {
            ctx.tls_server_name = value;
          } else if (field == "insecure") {
            if (!YAML::convert<bool>::decode(f.second, ctx.insecure)) {
              return Bad(path, absl::StrCat(where, ".insecure: expected true or false"));
            }
          } else {
            return Bad(path, absl::StrCat(where, ".", field,
                                          ": unknown key (coordinator, token-file, tls-ca, "
                                          "tls-cert, tls-key, tls-server-name, insecure)"));
          }
        }
      }
    } else {
      return Bad(path, absl::StrCat(key, ": unknown key (current-context, contexts)"));
    }
  }
  if (!config.current_context.empty() && !config.contexts.count(config.current_context)) {
    return Bad(path, absl::StrCat("current-context: '", config.current_context,
                                  "' is not among the contexts"));
  }
  return config;
}

absl::Status SaveConfig(const std::string& path, const CliConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  if (!config.current_context.empty()) {
    out << YAML::Key << "current-context" << YAML::Value << config.current_context;
  }
  out << YAML::Key << "contexts" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, c] : config.contexts) {
    out << YAML::Key << name << YAML::Value << YAML::BeginMap;
    auto field = [&](const char* key, const std::string& value) {
      if (!value.empty()) out << YAML::Key << key << YAML::Value << value;
    };
    field("coordinator", c.coordinator);
    field("token-file", c.token_file);
    field("tls-ca", c.tls_ca);
    field("tls-cert", c.tls_cert);
    field("tls-key", c.tls_key);
    field("tls-server-name", c.tls_server_name);
    if (c.insecure) out << YAML::Key << "insecure" << YAML::Value << true;
    out << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  std::error_code ec;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) return absl::UnavailableError(absl::StrCat(path, ": ", ec.message()));
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream file(tmp, std::ios::trunc);
    file << "# stagewise CLI contexts (docs/cli.md, \"Contexts\")\n" << out.c_str() << "\n";
    if (!file) return absl::UnavailableError(absl::StrCat("writing ", tmp));
  }
  ::chmod(tmp.c_str(), 0600);  // it names credential files
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat(path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<const Context*> SelectContext(const CliConfig& config, const std::string& name) {
  const std::string& wanted = name.empty() ? config.current_context : name;
  if (wanted.empty()) return nullptr;
  const auto it = config.contexts.find(wanted);
  if (it == config.contexts.end()) {
    std::vector<std::string> known;
    for (const auto& [n, _] : config.contexts) known.push_back(n);
    return absl::NotFoundError(absl::StrCat(
        "context '", wanted, "' is not in ", ConfigPath(), " (",
        known.empty() ? "no contexts: add one with `stagewise config set-context NAME ...`"
                      : absl::StrCat("contexts: ", absl::StrJoin(known, ", ")),
        ")"));
  }
  return &it->second;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat("token-file ", file, ": cannot read it"));
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty())
    return absl::InvalidArgumentError(absl::StrCat("token-file ", file, ": empty"));
  return token;
}

std::string ContextsTable(const CliConfig& config) {
  std::vector<std::vector<std::string>> rows = {{"CURRENT", "NAME", "COORDINATOR", "TLS", "TOKEN"}};
  for (const auto& [name, c] : config.contexts) {
    const bool tls = !c.insecure && (!c.tls_ca.empty() || !c.tls_cert.empty());
    rows.push_back({name == config.current_context ? "*" : "", name,
                    c.coordinator.empty() ? "-" : c.coordinator,
                    tls ? "mutual" : (c.insecure ? "off" : "-"),
                    c.token_file.empty() ? "-" : c.token_file});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i],
                      i + 1 < row.size() ? std::string(width[i] - row[i].size() + 2, ' ') : "");
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

int ConfigCommand(const ConfigArgs& args, std::ostream& out, std::ostream& err) {
  const std::string path = ConfigPath();
  absl::StatusOr<CliConfig> config = LoadConfig(path);
  if (!config.ok()) {
    err << "error: " << config.status().message() << "\n";
    return 2;
  }
  auto save = [&](const std::string& done) {
    if (absl::Status s = SaveConfig(path, *config); !s.ok()) {
      err << "error: " << s.message() << "\n";
      return 1;
    }
    out << done << " (" << path << ")\n";
    return 0;
  };
  if (args.action == "get-contexts") {
    if (config->contexts.empty()) {
      err << "no contexts in " << path
          << " (add one: stagewise config set-context NAME --coordinator HOST:PORT ...)\n";
      return 0;
    }
    out << ContextsTable(*config);
    return 0;
  }
  if (args.action == "current-context") {
    if (config->current_context.empty()) {
      err << "no current context in " << path << "\n";
      return 1;
    }
    out << config->current_context << "\n";
    return 0;
  }
  if (args.action == "use-context" || args.action == "delete-context") {
    absl::StatusOr<const Context*> found = SelectContext(*config, args.name);
    if (!found.ok()) {
      err << "error: " << found.status().message() << "\n";
      return 2;
    }
    if (args.action == "use-context") {
      config->current_context = args.name;
      return save(absl::StrCat("now using context ", args.name));
    }
    config->contexts.erase(args.name);
    if (config->current_context == args.name) config->current_context.clear();
    return save(absl::StrCat("deleted context ", args.name));
  }
  if (args.action == "set-context") {
    const bool created = !config->contexts.count(args.name);
    Context& c = config->contexts[args.name];
    for (const std::string& field : args.given) {
      if (field == "coordinator") c.coordinator = args.set.coordinator;
      if (field == "token-file") c.token_file = fs::absolute(args.set.token_file).string();
      if (field == "tls-ca") c.tls_ca = fs::absolute(args.set.tls_ca).string();
      if (field == "tls-cert") c.tls_cert = fs::absolute(args.set.tls_cert).string();
      if (field == "tls-key") c.tls_key = fs::absolute(args.set.tls_key).string();
      if (field == "tls-server-name") c.tls_server_name = args.set.tls_server_name;
      if (field == "insecure") c.insecure = args.set.insecure;
    }
    if (config->current_context.empty()) config->current_context = args.name;
    return save(absl::StrCat(created ? "created" : "updated", " context ", args.name,
                             config->current_context == args.name ? " (current)" : ""));
  }
  err << "error: unknown config action '" << args.action << "'\n";
  return 2;
}

}  // namespace stagewise::cli
