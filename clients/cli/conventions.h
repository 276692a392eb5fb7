// What every `stagewise` command shares, apart from its work (docs/cli.md,
// "Conventions"): the closest command to a mistyped one, `-o yaml` (the
// command's JSON output as YAML) and the shell completion script.
// No LibTorch, no gRPC: the CLI's unit tests link it alone.
#ifndef STAGEWISE_CLIENTS_CLI_CONVENTIONS_H_
#define STAGEWISE_CLIENTS_CLI_CONVENTIONS_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagewise::cli {

// `s` escaped as the inside of a JSON string literal.
std::string JsonEscape(const std::string& s);

// The edit distance (insertions, deletions, substitutions) between a and b.
int EditDistance(const std::string& a, const std::string& b);

// The candidate closest to `word` by edit distance (a candidate that starts
// with `word` counts as closest), or "" when none is within half the word's
// length (at least 2): "stats" -> "status", "xyzzy" -> "".
std::string ClosestName(const std::string& word, const std::vector<std::string>& candidates);

// The word on the command line that names the command: the first argument
// that is neither an option nor the value of one of `app`'s own options;
// "" when there is none. `stagewise --coordinator HOST:7070 nosuch` -> "nosuch".
std::string CommandWord(const CLI::App& app, const std::vector<std::string>& args);

// A word where a command is expected that names none: at the top level, and
// inside commands that have commands of their own (`config use-contex`,
// `admin nosuch --help`). `parent` is the command path it was given under
// ("" at the top, "config"), `closest` the suggestion ("" for none).
struct UnknownCommand {
  std::string parent;
  std::string word;
  std::string closest;
};
std::optional<UnknownCommand> FindUnknownCommand(const CLI::App& app,
                                                 const std::vector<std::string>& args);

// A command's SOURCE (a job id or a file) names a file when it exists as
// one, or looks like a path: it has a '/' or a '.', which job ids
// ("job-1a2b3c4d") never have. `plot ./nonexist.tsv` is then a missing file,
// not a job the coordinator is asked about.
bool IsFileSource(const std::string& source);

// Every subcommand's name, in the order they were added.
std::vector<std::string> CommandNames(const CLI::App& app);

// One or more JSON documents (as the commands' `-o json` prints them: one
// document, or one per line) as YAML, documents separated by "---".
// Strings stay strings ("123" is quoted). INVALID_ARGUMENT if a line is not
// JSON.
absl::StatusOr<std::string> JsonToYaml(const std::string& json);

// Dynamic completion (complete.cc): what `stagewise __complete WORDS...`
// offers for the last of WORDS (the word being typed, maybe empty), the words
// before it being the command line so far: subcommands, options (the
// command's and the global ones), an option's values (-o formats, --context
// names, file names), or a positional argument's (job ids from the
// coordinator, contexts, file names). Only words starting with the typed one.
struct CompletionSources {
  std::function<std::vector<std::string>()> job_ids;   // null: none
  std::function<std::vector<std::string>()> contexts;  // null: none
};
struct CompletionReply {
  std::vector<std::string> words;
  bool files = false;  // the shell should offer file names too
};
CompletionReply Complete(const CLI::App& app, const std::vector<std::string>& words,
                         const CompletionSources& sources);
// The reply as `__complete` prints it: "files" or "words", then one
// candidate per line.
std::string CompletionText(const CompletionReply& reply);

// The completion script for `shell` (bash; zsh, through bashcompinit; fish),
// which asks `stagewise __complete` at every TAB. INVALID_ARGUMENT for
// another shell.
absl::StatusOr<std::string> CompletionScript(const std::string& shell);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_CONVENTIONS_H_
