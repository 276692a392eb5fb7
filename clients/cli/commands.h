// The `stagewise` CLI's commands; main.cc only parses flags and calls these.
#ifndef STAGEWISE_CLIENTS_CLI_COMMANDS_H_
#define STAGEWISE_CLIENTS_CLI_COMMANDS_H_

#include <cstdint>
#include <iosfwd>
#include <string>

namespace stagewise::cli {

// Exit codes shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;   // the job ran and failed
inline constexpr int kExitInvalid = 2;  // bad spec or arguments

struct TrainLocalArgs {
  std::string job_path;
  std::string output = "text";  // text | json
  int threads = 0;              // 0 = every core
  int64_t steps = -1;           // overrides the spec when >= 0
  double epochs = -1;           // overrides the spec when >= 0
  int64_t log_every = 50;
  bool resume = true;
  bool quiet = false;
};

struct ValidateArgs {
  std::string job_path;
  std::string output = "text";
};

std::string VersionString();
int TrainLocal(const TrainLocalArgs& args, std::ostream& out, std::ostream& err);
int Validate(const ValidateArgs& args, std::ostream& out, std::ostream& err);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_COMMANDS_H_
