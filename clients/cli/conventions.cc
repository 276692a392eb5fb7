#include "clients/cli/conventions.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "clients/cli/output.h"

namespace stagewise::cli {

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string ClosestName(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.empty()) return "";
  std::string best;
  int best_distance = std::max<int>(2, static_cast<int>(word.size()) / 2) + 1;
  for (const std::string& c : candidates) {
    const int d = absl::StartsWith(c, word) ? 0 : EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

std::vector<std::string> CommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  return names;
}

namespace {

// The index in args[from...] of the first word that is neither an option nor
// the value of one of `app`'s options (or `root`'s: global options may come
// after a command); args.size() when there is none.
size_t CommandWordAt(const CLI::App& app, const CLI::App& root,
                     const std::vector<std::string>& args, size_t from) {
  for (size_t i = from; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") return i + 1;
    if (a.size() > 1 && a[0] == '-') {
      // An option with its value in the next word (not --name=value).
      if (a.find('=') == std::string::npos) {
        const CLI::Option* opt = app.get_option_no_throw(a);
        if (opt == nullptr) opt = root.get_option_no_throw(a);
        if (opt != nullptr && opt->get_items_expected_max() > 0) ++i;
      }
      continue;
    }
    return i;
  }
  return args.size();
}

}  // namespace

std::string CommandWord(const CLI::App& app, const std::vector<std::string>& args) {
  const size_t i = CommandWordAt(app, app, args, 0);
  return i < args.size() ? args[i] : "";
}

bool IsFileSource(const std::string& source) {
  std::error_code ec;
  return std::filesystem::exists(source, ec) || source.find_first_of("/.") != std::string::npos;
}

std::optional<UnknownCommand> FindUnknownCommand(const CLI::App& app,
                                                 const std::vector<std::string>& args) {
  const CLI::App* current = &app;
  std::string parent;
  size_t from = 0;
  while (true) {
    const size_t i = CommandWordAt(*current, app, args, from);
    if (i >= args.size()) return std::nullopt;
    const std::vector<std::string> names = CommandNames(*current);
    if (std::find(names.begin(), names.end(), args[i]) == names.end()) {
      return UnknownCommand{parent, args[i], ClosestName(args[i], names)};
    }
    const CLI::App* sub = current->get_subcommand(args[i]);  // named: it exists
    if (CommandNames(*sub).empty()) return std::nullopt;     // what follows are its arguments
    parent = parent.empty() ? args[i] : absl::StrCat(parent, " ", args[i]);
    current = sub;
    from = i + 1;
  }
}

namespace {

// The top-level JSON values of `json` (objects or arrays), in order: one
// document, or several (one per line, or any layout). Strings may hold
// brackets; a value that never closes is an error.
absl::StatusOr<std::vector<std::string>> SplitJson(const std::string& json) {
  std::vector<std::string> docs;
  int depth = 0, line = 1, start_line = 1;
  bool in_string = false, escaped = false;
  size_t start = 0;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '\n') ++line;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (depth++ == 0) {
        start = i;
        start_line = line;
      }
    } else if (c == '}' || c == ']') {
      if (--depth < 0)
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line, ": unmatched '", std::string(1, c), "'"));
      if (depth == 0) docs.push_back(json.substr(start, i + 1 - start));
    } else if (depth == 0 && !absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line, ": not JSON output"));
    }
  }
  if (depth != 0 || in_string) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", start_line, ": a value that does not end"));
  }
  return docs;
}

}  // namespace

absl::StatusOr<std::string> JsonToYaml(const std::string& json) {
  absl::StatusOr<std::vector<std::string>> texts = SplitJson(json);
  if (!texts.ok()) return texts.status();
  std::string out;
  for (const std::string& text : *texts) {
    const Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return absl::InvalidArgumentError("not JSON output");
    absl::StrAppend(&out, out.empty() ? "" : "---\n", YamlOf(doc), "\n");
  }
  return out;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace stagewise::cli
