// The --log-level flag every stagewise binary takes (as rpc::AddTlsFlags is
// the TLS flags'): one spelling, one help text, one environment default.
//
//   std::string level = "info";
//   log::AddLogLevelFlag(&app, &level);
//   CLI11_PARSE(app, argc, argv);
//   if (absl::Status s = log::ApplyLogLevelFlag(level); !s.ok()) { ...; return 2; }
#ifndef STAGEWISE_SERVICES_COMMON_LOG_FLAGS_H_
#define STAGEWISE_SERVICES_COMMON_LOG_FLAGS_H_

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/common/log.h"

namespace stagewise::log {

// Adds --log-level to `app`; STAGEWISE_LOG_LEVEL, when set, is the default.
inline void AddLogLevelFlag(CLI::App* app, std::string* level) {
  if (const char* env = std::getenv("STAGEWISE_LOG_LEVEL")) *level = env;
  app->add_option(
      "--log-level", *level,
      "debug | info | warning | error | off (env STAGEWISE_LOG_LEVEL sets the default)");
}

// Sets the process's level; INVALID_ARGUMENT naming the flag otherwise.
inline absl::Status ApplyLogLevelFlag(const std::string& level) {
  absl::StatusOr<Level> parsed = ParseLevel(level);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-level: ", parsed.status().message()));
  }
  SetLogLevel(*parsed);
  return absl::OkStatus();
}

}  // namespace stagewise::log

#endif  // STAGEWISE_SERVICES_COMMON_LOG_FLAGS_H_
