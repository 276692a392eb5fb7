// The CLI's config file (docs/cli.md, "Contexts"): named contexts, each a
// coordinator with the token file and certificates to reach it, and the
// current one, as kubectl's kubeconfig and ray's cluster configs have.
//
//   current-context: prod
//   contexts:
//     prod:
//       coordinator: stagewise.example.com:7070
//       token-file: ~/.config/stagewise/prod.token
//       tls-ca: ~/.config/stagewise/prod/ca.pem
//       tls-cert: ~/.config/stagewise/prod/client.pem
//       tls-key: ~/.config/stagewise/prod/client.key
//       tls-server-name: stagewise.cluster
//     laptop:
//       coordinator: 127.0.0.1:7070
//
// A flag or an environment variable wins over the context.
#ifndef STAGEWISE_CLIENTS_CLI_CONFIG_FILE_H_
#define STAGEWISE_CLIENTS_CLI_CONFIG_FILE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stagewise::cli {

struct Context {
  std::string coordinator;  // HOST:PORT
  std::string token_file;   // a file holding the bearer token
  std::string tls_ca;       // PEM files, as --tls-ca, --tls-cert, --tls-key
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;  // as --tls-server-name
  bool insecure = false;        // as --insecure
};

struct CliConfig {
  std::string current_context;  // "" = none
  std::map<std::string, Context> contexts;
};

// $STAGEWISE_CONFIG, else $XDG_CONFIG_HOME/stagewise/config.yaml, else
// $HOME/.config/stagewise/config.yaml.
std::string ConfigPath();

// A missing file is an empty config. INVALID_ARGUMENT names the file and the
// key for anything else: not YAML, an unknown key, a current-context that is
// not among the contexts. "~/" at the start of a path is $HOME.
absl::StatusOr<CliConfig> LoadConfig(const std::string& path);

// Writes `config` to `path` (directories created, mode 0600, through a
// temporary file and a rename).
absl::Status SaveConfig(const std::string& path, const CliConfig& config);

// The context to use: `name` if given (the --context flag or
// $STAGEWISE_CONTEXT), else the current one; nullptr when neither is set.
// NOT_FOUND names the missing context and the known ones.
absl::StatusOr<const Context*> SelectContext(const CliConfig& config, const std::string& name);

// The token in `file`, without surrounding whitespace; INVALID_ARGUMENT
// naming the file when it cannot be read or is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& file);

// `stagewise config get-contexts`: NAME, COORDINATOR, TLS, TOKEN; the current
// one marked with '*'.
std::string ContextsTable(const CliConfig& config);

// `stagewise config ACTION`: get-contexts, current-context, use-context NAME,
// set-context NAME (the fields in `given` from `set`, others kept; a new
// context with no current one becomes current), delete-context NAME.
// Exit 0, 2 for a bad config file or an unknown context, 1 when it cannot
// be written.
struct ConfigArgs {
  std::string action;
  std::string name;
  Context set;
  // set-context: the fields given ("coordinator", "token-file", "tls-ca",
  // "tls-cert", "tls-key", "tls-server-name", "insecure").
  std::vector<std::string> given;
};
int ConfigCommand(const ConfigArgs& args, std::ostream& out, std::ostream& err);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_CONFIG_FILE_H_
