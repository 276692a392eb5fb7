// The one logger of every stagewise process: leveled lines on stderr,
//   I20261123 08:41:07.123456 worker.cc:110] control session ended: ...
// (severity letter, UTC date and time, source file:line, message). Debian 12's
// abseil predates absl/log, so this is a small one of our own.
//
//   STAGEWISE_LOG(INFO) << "serving on " << address;
//   STAGEWISE_LOG(WARNING) << "lost worker " << id;
//
// Lines below the process's level are not formatted at all. The level comes
// from SetLogLevel (the binaries' --log-level flag) or, before that, from the
// STAGEWISE_LOG_LEVEL environment variable; the default is INFO. Each line is
// written with one write(2), so lines from different threads never interleave.
#ifndef STAGEWISE_SERVICES_COMMON_LOG_H_
#define STAGEWISE_SERVICES_COMMON_LOG_H_

#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagewise::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// "debug" | "info" | "warning" | "error" | "off" (case-insensitive; "warn" too);
// INVALID_ARGUMENT otherwise (the message does not name the flag: callers do).
absl::StatusOr<Level> ParseLevel(absl::string_view text);
absl::string_view LevelName(Level level);

void SetLogLevel(Level level);
Level GetLogLevel();
inline bool Enabled(Level level) { return level >= GetLogLevel() && level != Level::kOff; }

// Where lines go; nullptr restores stderr. For tests.
using Sink = void (*)(absl::string_view line);
void SetSinkForTesting(Sink sink);

// One log line, written when the statement ends.
class Line {
 public:
  Line(Level level, const char* file, int line);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;
  std::ostream& stream() { return out_; }

 private:
  Level level_;
  std::ostringstream out_;
};

// Swallows the stream expression of a disabled line (glog's trick).
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace stagewise::log

#define STAGEWISE_LOG_LEVEL_DEBUG ::stagewise::log::Level::kDebug
#define STAGEWISE_LOG_LEVEL_INFO ::stagewise::log::Level::kInfo
#define STAGEWISE_LOG_LEVEL_WARNING ::stagewise::log::Level::kWarning
#define STAGEWISE_LOG_LEVEL_ERROR ::stagewise::log::Level::kError

#define STAGEWISE_LOG(severity)                              \
  !::stagewise::log::Enabled(STAGEWISE_LOG_LEVEL_##severity) \
      ? (void)0                                              \
      : ::stagewise::log::Voidify() &                        \
            ::stagewise::log::Line(STAGEWISE_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()

#endif  // STAGEWISE_SERVICES_COMMON_LOG_H_
