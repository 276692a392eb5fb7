// Flags several commands share, added by each command's own Add*Command
// (clients/cli/<command>.cc).
#ifndef STAGEWISE_CLIENTS_CLI_FLAGS_H_
#define STAGEWISE_CLIENTS_CLI_FLAGS_H_

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace stagewise::cli {

// --set KEY.PATH=VALUE on every command that reads a job file (docs/cli.md,
// "Overriding keys").
void AddSetOption(CLI::App* command, std::vector<std::string>& sets);
// -o/--output text|json|yaml.
void AddOutputOption(CLI::App* command, std::string& output, const char* what);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_FLAGS_H_
