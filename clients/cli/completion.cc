// `stagewise completion SHELL` (the script) and the hidden
// `stagewise __complete WORDS...` it calls at every TAB (conventions.h).
#include <ostream>

#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/config_file.h"
#include "clients/cli/conventions.h"
#include "clients/client/coordinator_client.h"

namespace stagewise::cli {
namespace {

// The global flags among the words typed so far, so that job ids come from
// the coordinator the command line names (best effort: a half-typed line).
void TakeGlobalFlags(const std::vector<std::string>& words, GlobalFlags& g) {
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    const std::string& w = words[i];
    std::string* field = w == "--coordinator" ? &g.coordinator
                         : w == "--context"   ? &g.context_name
                         : w == "--token"     ? &g.token
                                              : nullptr;
    if (field != nullptr) *field = words[i + 1];
  }
}

std::vector<std::string> ContextNames() {
  absl::StatusOr<CliConfig> config = LoadConfig(ConfigPath());
  std::vector<std::string> names;
  if (!config.ok()) return names;
  for (const auto& [name, context] : config->contexts) names.push_back(name);
  return names;
}

// The newest jobs' ids; none when the coordinator does not answer in 2 s.
std::vector<std::string> JobIds(Invocation& run) {
  std::vector<std::string> ids;
  absl::StatusOr<std::string> coordinator = run.Connect();
  if (!coordinator.ok()) return ids;
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(*coordinator),
                                   absl::Seconds(2));
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client.ListJobs(200);
  if (!jobs.ok()) return ids;
  for (const v1::JobStatus& j : *jobs) ids.push_back(j.job_id());
  return ids;
}

}  // namespace

void AddCompletionCommand(CommandSet& set) {
  auto shell = std::make_shared<std::string>();
  CLI::App* cmd = set.Add(
      "completion",
      "Print a shell completion script; it completes commands, options, -o formats, contexts,\n"
      "file names and the coordinator's job ids (asking `stagewise __complete`):\n"
      "  bash: source <(stagewise completion bash)   (or save it under\n"
      "        /etc/bash_completion.d/ or ~/.local/share/bash-completion/completions/stagewise)\n"
      "  zsh:  source <(stagewise completion zsh)    (uses bashcompinit)\n"
      "  fish: stagewise completion fish > ~/.config/fish/completions/stagewise.fish",
      [shell](Invocation& run) {
        absl::StatusOr<std::string> script = CompletionScript(*shell);
        if (!script.ok()) {
          run.err() << "error: " << script.status().message() << "\n";
          return kExitInvalid;
        }
        run.out() << *script;
        return kExitOk;
      });
  cmd->add_option("shell", *shell, "bash, zsh or fish")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh", "fish"}));

  set.AddRaw("__complete", [](const std::vector<std::string>& words, Invocation& run) {
    TakeGlobalFlags(words, run.globals());
    CompletionSources sources;
    sources.contexts = ContextNames;
    sources.job_ids = [&run] { return JobIds(run); };
    run.out() << CompletionText(Complete(run.root(), words, sources));
    return kExitOk;
  });
}

}  // namespace stagewise::cli
