// `stagewise config ...`: the contexts of the config file (config_file.h).
#include <ostream>

#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/config_file.h"

namespace stagewise::cli {
namespace {

// set-context takes the global flags given on this command line (not their
// environment variables).
void TakeGivenFlags(const CLI::App& root, const CLI::App& set_context, const GlobalFlags& g,
                    ConfigArgs& args) {
  struct Given {
    const CLI::Option* option;
    const std::string* value;  // the parsed flag (set-context's own: already in place)
    std::string* field;
  };
  const Given given[] = {
      {root.get_option("--coordinator"), &g.coordinator, &args.set.coordinator},
      {root.get_option("--tls-ca"), &g.tls.ca_file, &args.set.tls_ca},
      {root.get_option("--tls-cert"), &g.tls.cert_file, &args.set.tls_cert},
      {root.get_option("--tls-key"), &g.tls.key_file, &args.set.tls_key},
      {root.get_option("--tls-server-name"), &g.tls.server_name, &args.set.tls_server_name},
      {set_context.get_option("--token-file"), nullptr, nullptr}};
  for (const Given& flag : given) {
    if (flag.option->count() == 0) continue;
    args.given.push_back(flag.option->get_lnames().front());
    if (flag.field != nullptr) *flag.field = *flag.value;
  }
  if (root.get_option("--insecure")->count() > 0) {
    args.given.push_back("insecure");
    args.set.insecure = g.tls.insecure;
  }
}

}  // namespace

void AddConfigCommand(CommandSet& set) {
  CLI::App* config =
      set.Add(nullptr, "config",
              "Contexts: named coordinators with their token file and certificates, kept in\n"
              "~/.config/stagewise/config.yaml ($STAGEWISE_CONFIG); the current one is used when\n"
              "no --coordinator, --token or --tls-* flag (or variable) says otherwise");
  auto args = std::make_shared<ConfigArgs>();
  const auto action = [args](const std::string& name) {
    return [args, name](Invocation& run) {
      args->action = name;
      return ConfigCommand(*args, run.out(), run.err());
    };
  };
  set.Add(config, "get-contexts", "List the contexts (* marks the current one)",
          action("get-contexts"));
  set.Add(config, "current-context", "Print the current context's name", action("current-context"));
  set.Add(config, "use-context", "Make NAME the current context", action("use-context"))
      ->add_option("name", args->name, "Context name")
      ->required();
  set.Add(config, "delete-context", "Remove context NAME", action("delete-context"))
      ->add_option("name", args->name, "Context name")
      ->required();
  auto set_context = std::make_shared<CLI::App*>(nullptr);
  *set_context =
      set.Add(config, "set-context",
              "Create or update context NAME from the flags given with it: --coordinator,\n"
              "--token-file, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --insecure (the\n"
              "others are kept). The first context becomes the current one",
              [args, set_context](Invocation& run) {
                args->action = "set-context";
                TakeGivenFlags(run.root(), **set_context, run.globals(), *args);
                return ConfigCommand(*args, run.out(), run.err());
              });
  (*set_context)->add_option("name", args->name, "Context name")->required();
  (*set_context)
      ->add_option("--token-file", args->set.token_file,
                   "A file holding the bearer token (kept as a path, not copied)");
}

}  // namespace stagewise::cli
