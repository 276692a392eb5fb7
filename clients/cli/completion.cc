// `stagewise completion SHELL`: the shell completion script.
#include <ostream>

#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/conventions.h"

namespace stagewise::cli {

void AddCompletionCommand(CommandSet& set) {
  auto shell = std::make_shared<std::string>();
  CLI::App* cmd = set.Add(
      "completion",
      "Print a shell completion script (commands, their options, file names):\n"
      "  bash: source <(stagewise completion bash)   (or save it under\n"
      "        /etc/bash_completion.d/ or ~/.local/share/bash-completion/completions/stagewise)\n"
      "  zsh:  source <(stagewise completion zsh)    (uses bashcompinit)",
      [shell](Invocation& run) {
        absl::StatusOr<std::string> script = CompletionScript(run.root(), *shell);
        if (!script.ok()) {
          run.err() << "error: " << script.status().message() << "\n";
          return kExitInvalid;
        }
        run.out() << *script;
        return kExitOk;
      });
  cmd->add_option("shell", *shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));
}

}  // namespace stagewise::cli
