// Dynamic shell completion (conventions.h): what `stagewise __complete`
// offers, and the bash, zsh and fish scripts that ask it.
#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/cli/conventions.h"

namespace stagewise::cli {
namespace {

// What a positional argument or an option's value holds, by its name.
enum class Holds { kNothing, kFiles, kJobIds, kJobIdsOrFiles, kContexts, kShells, kFixed };

struct ValueKind {
  Holds holds;
  std::vector<std::string> fixed = {};
};

ValueKind KindOf(const std::string& name) {
  static const std::map<std::string, ValueKind> kinds = {
      {"job_id", {Holds::kJobIds}},
      {"jobs", {Holds::kJobIds}},
      {"source", {Holds::kJobIdsOrFiles}},
      {"sources", {Holds::kJobIdsOrFiles}},
      {"job", {Holds::kFiles}},
      {"file", {Holds::kFiles}},
      {"name", {Holds::kContexts}},
      {"context", {Holds::kContexts}},
      {"shell", {Holds::kShells}},
      {"output", {Holds::kFixed, {"text", "json", "yaml"}}},
      {"modes", {Holds::kFixed, {"auto", "store", "rebuild"}}},
      {"partition", {Holds::kFixed, {"job", "auto"}}},
      {"log-level", {Holds::kFixed, {"debug", "info", "warning", "error"}}},
      {"device", {Holds::kFixed, {"cpu", "cuda:0"}}},
  };
  if (auto it = kinds.find(name); it != kinds.end()) return it->second;
  // Options that name a file or a directory.
  for (const char* part : {"file", "dir", "svg", "history", "trace", "timeline", "tls-",
                           "checkpoint", "cache", "key", "db"}) {
    if (absl::StrContains(name, part)) return {Holds::kFiles};
  }
  return {Holds::kNothing};
}

bool Visible(const CLI::App* sub) { return !sub->get_group().empty(); }

const CLI::Option* FindOption(const CLI::App& app, const CLI::App& root, const std::string& word) {
  const std::string name = word.substr(0, word.find('='));
  const CLI::Option* opt = app.get_option_no_throw(name);
  return opt != nullptr ? opt : root.get_option_no_throw(name);
}

void AddOptionNames(const CLI::App& app, std::vector<std::string>& out) {
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_group().empty() || !opt->nonpositional()) continue;
    for (const std::string& l : opt->get_lnames()) out.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) out.push_back("-" + s);
  }
}

void AddValues(const ValueKind& kind, const CompletionSources& sources, CompletionReply& reply) {
  const auto call = [](const std::function<std::vector<std::string>()>& f) {
    return f ? f() : std::vector<std::string>{};
  };
  switch (kind.holds) {
    case Holds::kFiles:
      reply.files = true;
      break;
    case Holds::kJobIds:
      reply.words = call(sources.job_ids);
      break;
    case Holds::kJobIdsOrFiles:
      reply.words = call(sources.job_ids);
      reply.files = true;
      break;
    case Holds::kContexts:
      reply.words = call(sources.contexts);
      break;
    case Holds::kShells:
      reply.words = {"bash", "zsh", "fish"};
      break;
    case Holds::kFixed:
      reply.words = kind.fixed;
      break;
    case Holds::kNothing:
      break;
  }
}

}  // namespace

CompletionReply Complete(const CLI::App& app, const std::vector<std::string>& words,
                         const CompletionSources& sources) {
  const CLI::App* current = &app;
  const CLI::Option* value_of = nullptr;  // the option whose value comes next
  size_t positional = 0;
  const size_t typed = words.empty() ? 0 : words.size() - 1;
  for (size_t i = 0; i < typed; ++i) {
    const std::string& w = words[i];
    if (value_of != nullptr) {
      value_of = nullptr;
      continue;
    }
    if (w.size() > 1 && w[0] == '-') {
      const CLI::Option* opt = FindOption(*current, app, w);
      if (opt != nullptr && opt->get_items_expected_max() > 0 && w.find('=') == std::string::npos) {
        value_of = opt;
      }
      continue;
    }
    const CLI::App* sub = nullptr;
    for (const CLI::App* s : current->get_subcommands([](const CLI::App*) { return true; })) {
      if (s->get_name() == w) sub = s;
    }
    if (sub != nullptr) {
      current = sub;
      positional = 0;
    } else {
      ++positional;
    }
  }
  const std::string prefix = words.empty() ? "" : words.back();
  CompletionReply reply;
  if (value_of != nullptr) {
    AddValues(KindOf(value_of->get_lnames().empty() ? value_of->get_name()
                                                    : value_of->get_lnames().front()),
              sources, reply);
  } else if (absl::StartsWith(prefix, "-")) {
    AddOptionNames(*current, reply.words);
    if (current != &app) AddOptionNames(app, reply.words);
  } else {
    bool has_commands = false;
    for (const CLI::App* s : current->get_subcommands([](const CLI::App*) { return true; })) {
      if (!Visible(s)) continue;
      has_commands = true;
      reply.words.push_back(s->get_name());
    }
    if (!has_commands) {
      std::vector<const CLI::Option*> args;
      for (const CLI::Option* opt : current->get_options()) {
        if (!opt->nonpositional()) args.push_back(opt);
      }
      if (!args.empty()) {
        // The last positional takes the rest when it is a list (plot's sources).
        AddValues(KindOf(args[std::min(positional, args.size() - 1)]->get_name()), sources, reply);
      }
    }
  }
  reply.words.erase(std::remove_if(reply.words.begin(), reply.words.end(),
                                   [&](const std::string& w) {
                                     return !absl::StartsWith(w, prefix) ||
                                            w.find_first_of("\n\r") != std::string::npos;
                                   }),
                    reply.words.end());
  return reply;
}

std::string CompletionText(const CompletionReply& reply) {
  std::string out = reply.files ? "files\n" : "words\n";
  for (const std::string& w : reply.words) absl::StrAppend(&out, w, "\n");
  return out;
}

absl::StatusOr<std::string> CompletionScript(const std::string& shell) {
  const std::string bash =
      "_stagewise() {\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]} IFS=$'\\n' reply\n"
      "  reply=($(\"${COMP_WORDS[0]}\" __complete \"${COMP_WORDS[@]:1:COMP_CWORD}\" "
      "2>/dev/null)) || return\n"
      "  [[ ${#reply[@]} -gt 0 ]] || return\n"
      "  COMPREPLY=($(compgen -W \"${reply[*]:1}\" -- \"$cur\"))\n"
      "  if [[ ${reply[0]} == files ]]; then COMPREPLY+=($(compgen -f -- \"$cur\")); fi\n"
      "}\n"
      "complete -o default -F _stagewise stagewise\n";
  const std::string header = absl::StrCat(
      "# ", shell, " completion for stagewise: ", "generated by `stagewise completion ", shell,
      "`; it asks `stagewise __complete WORDS...`.\n");
  if (shell == "bash") return header + bash;
  if (shell == "zsh") return header + "autoload -U +X bashcompinit && bashcompinit\n" + bash;
  if (shell == "fish") {
    return header +
           "function __stagewise_complete\n"
           "    set -l words (commandline -opc) (commandline -ct)\n"
           "    set -l reply ($words[1] __complete $words[2..-1] 2>/dev/null)\n"
           "    test (count $reply) -gt 0; or return\n"
           "    for w in $reply[2..-1]; echo $w; end\n"
           "    if test \"$reply[1]\" = files; __fish_complete_path (commandline -ct); end\n"
           "end\n"
           "complete -c stagewise -f -a '(__stagewise_complete)'\n";
  }
  return absl::InvalidArgumentError(
      absl::StrCat("shell: '", shell, "' is not one of bash, zsh, fish"));
}

}  // namespace stagewise::cli
