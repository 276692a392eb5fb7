// How the `stagewise` CLI's commands are put together: each
// clients/cli/<command>.cc adds its own command (its flags bound to its own
// options struct) to a CommandSet with the function that runs it; main.cc
// only adds the global flags and the commands, then calls Run.
#ifndef STAGEWISE_CLIENTS_CLI_COMMAND_H_
#define STAGEWISE_CLIENTS_CLI_COMMAND_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/rpc/tls.h"

namespace stagewise::cli {

// The flags every command accepts, before or after its name.
struct GlobalFlags {
  std::string coordinator;   // --coordinator ("" = $STAGEWISE_COORDINATOR, else the default)
  rpc::TlsConfig tls;        // --tls-*, --insecure
  std::string token;         // --token / $STAGEWISE_TOKEN
  std::string context_name;  // --context / $STAGEWISE_CONTEXT
};

// Adds the global flags to the top-level command.
void AddGlobalFlags(CLI::App& app, GlobalFlags& flags);

// What a command's run function gets: the global flags, the streams, and
// Connect() for the commands that talk to a coordinator.
class Invocation {
 public:
  Invocation(const CLI::App& root, GlobalFlags& globals, std::ostream& out, std::ostream& err)
      : root_(root), globals_(globals), out_(out), err_(err) {}

  const CLI::App& root() const { return root_; }
  GlobalFlags& globals() { return globals_; }
  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }

  // The config file's context fills what no flag or variable gave, and the
  // client's TLS and token are installed. Returns the coordinator address
  // ("" = the client's default), or INVALID_ARGUMENT (a bad config file, an
  // unknown context, an unreadable token file, a bad TLS flag).
  absl::StatusOr<std::string> Connect();
  // Connect(), then `run` with the coordinator's address; a Connect error is
  // printed and exits 2.
  int WithCoordinator(const std::function<int(const std::string&)>& run);

  // Runs `run` with the output format `output`: -o yaml runs it as json and
  // converts the result once it has finished.
  int Formatted(std::string& output, const std::function<int(std::ostream&)>& run);

 private:
  const CLI::App& root_;
  GlobalFlags& globals_;
  std::ostream& out_;
  std::ostream& err_;
};

using RunCommand = std::function<int(Invocation&)>;

// The commands of one CLI. Owns their run functions (and through them the
// options structs the flags are bound to).
class CommandSet {
 public:
  CommandSet(CLI::App& root, GlobalFlags& globals) : root_(root), globals_(globals) {}
  CommandSet(const CommandSet&) = delete;
  CommandSet& operator=(const CommandSet&) = delete;

  CLI::App& root() { return root_; }

  // A subcommand of `parent` (the top level when null) that `run` runs when
  // it is the command given. A command with subcommands passes no `run`.
  CLI::App* Add(CLI::App* parent, const std::string& name, const std::string& description,
                RunCommand run = nullptr);
  CLI::App* Add(const std::string& name, const std::string& description, RunCommand run) {
    return Add(nullptr, name, description, std::move(run));
  }

  // A hidden command that gets its words unparsed (`__complete`): when the
  // first argument is `name`, Run passes it the rest.
  void AddRaw(const std::string& name,
              std::function<int(const std::vector<std::string>&, Invocation&)> run) {
    raw_.emplace_back(name, std::move(run));
  }

  // Parses `args` (without the program name) and runs the command: 2 for an
  // unknown command (with a suggestion) or bad flags, --help's 0, else the
  // command's exit code.
  int Run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

 private:
  struct Entry {
    CLI::App* command;
    RunCommand run;
  };
  CLI::App& root_;
  GlobalFlags& globals_;
  std::vector<Entry> entries_;
  std::vector<
      std::pair<std::string, std::function<int(const std::vector<std::string>&, Invocation&)>>>
      raw_;
};

// An old spelling of a flag, kept working and hidden from --help.
class DeprecatedSpelling {
 public:
  // `was` and `now` as the warning spells them ("stagewise plot -o FILE",
  // "--output-file FILE").
  DeprecatedSpelling(CLI::App* command, const std::string& names, std::string was, std::string now);
  DeprecatedSpelling(const DeprecatedSpelling&) = delete;
  DeprecatedSpelling& operator=(const DeprecatedSpelling&) = delete;
  // The old value goes to `to` (with a warning). False, with the error
  // printed, when both spellings were given different values.
  bool Apply(std::string& to, std::ostream& err) const;

 private:
  std::string value_;  // before option_, which binds it
  CLI::Option* option_;
  std::string was_;
  std::string now_;
};

// "error: WHAT is required" when `value` is empty; false then.
bool RequireFlag(const std::string& value, const std::string& what, std::ostream& err);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_COMMAND_H_
