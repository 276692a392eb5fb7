#include "clients/cli/command.h"

#include <algorithm>
#include <cstdlib>
#include <ostream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "clients/cli/commands.h"
#include "clients/cli/config_file.h"
#include "clients/cli/conventions.h"
#include "clients/client/coordinator_client.h"
#include "services/common/parse_flags.h"

namespace stagewise::cli {

void AddGlobalFlags(CLI::App& app, GlobalFlags& flags) {
  app.add_option("--coordinator", flags.coordinator,
                 "Coordinator address HOST:PORT (default: $STAGEWISE_COORDINATOR, else "
                 "127.0.0.1:7070)");
  // Transport security and the bearer token of the commands that talk to a
  // coordinator.
  rpc::AddTlsFlags(&app, &flags.tls);
  app.add_option("--token", flags.token,
                 "Bearer token for the coordinator (env STAGEWISE_TOKEN); its role decides what "
                 "this client may do (read, submit, admin)")
      ->envname("STAGEWISE_TOKEN");
  app.add_option("--context", flags.context_name,
                 "The config file's context to talk to (env STAGEWISE_CONTEXT; default: its "
                 "current-context). Flags and environment variables win over it")
      ->envname("STAGEWISE_CONTEXT");
}

absl::StatusOr<std::string> Invocation::Connect() {
  GlobalFlags& g = globals_;
  absl::StatusOr<CliConfig> config = LoadConfig(ConfigPath());
  if (!config.ok()) return config.status();
  absl::StatusOr<const Context*> ctx = SelectContext(*config, g.context_name);
  if (!ctx.ok()) return ctx.status();
  if (*ctx != nullptr) {
    const Context& c = **ctx;
    const char* env = std::getenv("STAGEWISE_COORDINATOR");
    if (g.coordinator.empty() && (env == nullptr || *env == '\0')) g.coordinator = c.coordinator;
    if (g.token.empty() && !c.token_file.empty()) {
      absl::StatusOr<std::string> token = ReadTokenFile(c.token_file);
      if (!token.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("context: ", token.status().message()));
      }
      g.token = *token;
    }
    const bool tls_given = !g.tls.ca_file.empty() || !g.tls.cert_file.empty() ||
                           !g.tls.key_file.empty() || g.tls.insecure;
    if (!tls_given) {
      g.tls.ca_file = c.tls_ca;
      g.tls.cert_file = c.tls_cert;
      g.tls.key_file = c.tls_key;
      g.tls.insecure = c.insecure;
    }
    if (g.tls.server_name.empty()) g.tls.server_name = c.tls_server_name;
  }
  rpc::RpcOptions client_options;
  if (absl::Status s = rpc::ApplyTls(g.tls, &client_options); !s.ok()) return s;
  client_options.bearer_token = g.token;
  client::SetDefaultClientOptions(client_options);
  return g.coordinator;
}

int Invocation::WithCoordinator(const std::function<int(const std::string&)>& run) {
  absl::StatusOr<std::string> coordinator = Connect();
  if (!coordinator.ok()) {
    err_ << "error: " << coordinator.status().message() << "\n";
    return kExitInvalid;
  }
  return run(*coordinator);
}

int Invocation::Formatted(std::string& output, const std::function<int(std::ostream&)>& run) {
  if (output != "yaml") return run(out_);
  output = "json";
  std::ostringstream json;
  const int rc = run(json);
  absl::StatusOr<std::string> yaml = JsonToYaml(json.str());
  if (!yaml.ok()) {
    err_ << "error: -o yaml: " << yaml.status().message() << "\n";
    out_ << json.str();
    return rc == kExitOk ? kExitFailed : rc;
  }
  out_ << *yaml;
  return rc;
}

CLI::App* CommandSet::Add(CLI::App* parent, const std::string& name, const std::string& description,
                          RunCommand run) {
  CLI::App* command = (parent == nullptr ? &root_ : parent)->add_subcommand(name, description);
  if (run) {
    entries_.push_back({command, std::move(run)});
  } else {
    command->require_subcommand(1);
  }
  return command;
}

int CommandSet::Run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  for (const auto& [name, run] : raw_) {
    if (args.empty() || args[0] != name) continue;
    Invocation invocation(root_, globals_, out, err);
    return run(std::vector<std::string>(args.begin() + 1, args.end()), invocation);
  }
  // An unknown command is an error, even with --help after it (CLI11 would
  // print the top-level help and succeed).
  if (const auto unknown = FindUnknownCommand(root_, args)) {
    const std::string at = unknown->parent.empty() ? "" : unknown->parent + " ";
    err << "error: unknown command '" << at << unknown->word << "'"
        << (unknown->closest.empty() ? "" : "; did you mean '" + at + unknown->closest + "'?")
        << "\n"
        << "Run '" << root_.get_name() << " " << at << "--help' for the commands.\n";
    return kExitInvalid;
  }
  if (std::optional<int> code = ParseFlags(root_, args, out, err)) return *code;
  // The deepest parsed command runs (`admin backup`, not `admin`).
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (!it->command->parsed()) continue;
    Invocation invocation(root_, globals_, out, err);
    return it->run(invocation);
  }
  err << "error: no command given\nRun '" << root_.get_name() << " --help' for the commands.\n";
  return kExitInvalid;
}

DeprecatedSpelling::DeprecatedSpelling(CLI::App* command, const std::string& names, std::string was,
                                       std::string now)
    : option_(command->add_option(names, value_)->group("")),
      was_(std::move(was)),
      now_(std::move(now)) {}

bool DeprecatedSpelling::Apply(std::string& to, std::ostream& err) const {
  if (option_->count() == 0) return true;
  err << "warning: '" << was_ << "' is deprecated; use '" << now_
      << "' (-o names an output format in every command)\n";
  if (!to.empty() && to != value_) {
    err << "error: both '" << was_ << "' and '" << now_ << "' given\n";
    return false;
  }
  to = value_;
  return true;
}

void AddAllCommands(CommandSet& set) {
  AddVersionCommand(set);
  AddTrainLocalCommand(set);
  AddValidateCommand(set);
  AddRemoteCommands(set);
  AddExportCommand(set);
  AddPlotCommand(set);
  AddQueueCommand(set);
  AddGoodputCommand(set);
  AddTraceCommands(set);
  AddLocalCommand(set);
  AddPlanCommand(set);
  AddConfigCommand(set);
  AddCompletionCommand(set);
  AddMetricsLabelCommand(set);
}

bool RequireFlag(const std::string& value, const std::string& what, std::ostream& err) {
  if (!value.empty()) return true;
  err << "error: " << what << " is required\nRun with --help for more information.\n";
  return false;
}

}  // namespace stagewise::cli
