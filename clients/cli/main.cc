// stagewise: the command-line client. The commands add themselves
// (clients/cli/<command>.cc, command.h); this only sets up the top level.
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "clients/cli/command.h"
#include "clients/cli/commands.h"

int main(int argc, char** argv) {
  using namespace stagewise::cli;
  CLI::App app{
      "stagewise: train one neural network across many machines, with exact pipelined\n"
      "backpropagation or decoupled algorithms (PETRA, delayed gradients, features replay,\n"
      "N-wise interlocking backpropagation, auxiliary-variable networks).\n"
      "Job files are YAML; see docs/job_spec.md and examples/.",
      "stagewise"};
  app.require_subcommand(1);
  app.set_version_flag("--version", VersionString());
  // Lets the global flags also come after the subcommand.
  app.fallthrough();
  GlobalFlags globals;
  AddGlobalFlags(app, globals);
  CommandSet commands(app, globals);
  AddAllCommands(commands);
  return commands.Run(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
