// Parsing a binary's command line with CLI11 without its exceptions escaping
// (the CLI, the worker and the coordinator).
#ifndef STAGEWISE_SERVICES_COMMON_PARSE_FLAGS_H_
#define STAGEWISE_SERVICES_COMMON_PARSE_FLAGS_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace stagewise {

// Parses `args` (without the program name) into `app`'s options. nullopt to
// go on; otherwise the process's exit code: 0 after --help or --version
// (printed to `out`), 2 for a bad flag (named on `err`).
inline std::optional<int> ParseFlags(CLI::App& app, const std::vector<std::string>& args,
                                     std::ostream& out, std::ostream& err) {
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11's order
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

// What parsing a binary's flags gave: the flags to run with, or the exit
// code of a process that must not run.
template <typename Flags>
struct ParsedFlags {
  bool run = false;
  int exit_code = 0;
  Flags flags;
};

// ParseFlags, then `finish` (what the parsed values become: 0, or an exit
// code with the reason on `err`), then `take` (the flags to run with).
template <typename Flags>
ParsedFlags<Flags> ParseBinaryFlags(CLI::App& app, const std::vector<std::string>& args,
                                    std::ostream& out, std::ostream& err,
                                    const std::function<int()>& finish,
                                    const std::function<Flags()>& take) {
  ParsedFlags<Flags> result;
  if (std::optional<int> code = ParseFlags(app, args, out, err)) {
    result.exit_code = *code;
  } else if (const int finished = finish(); finished != 0) {
    result.exit_code = finished;
  } else {
    result.run = true;
    result.flags = take();
  }
  return result;
}

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_PARSE_FLAGS_H_
