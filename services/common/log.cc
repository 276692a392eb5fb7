#include "services/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace stagewise::log {
namespace {

Level LevelFromEnvironment() {
  const char* env = std::getenv("STAGEWISE_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return Level::kInfo;
  auto level = ParseLevel(env);
  return level.ok() ? *level : Level::kInfo;
}

std::atomic<int>& CurrentLevel() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnvironment())};
  return level;
}

std::atomic<Sink>& CurrentSink() {
  static std::atomic<Sink> sink{nullptr};
  return sink;
}

void WriteToStderr(absl::string_view line) {
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;  // nothing sensible to do when stderr is gone
    p += n;
    left -= static_cast<size_t>(n);
  }
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

}  // namespace

absl::StatusOr<Level> ParseLevel(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "debug") return Level::kDebug;
  if (t == "info") return Level::kInfo;
  if (t == "warning" || t == "warn") return Level::kWarning;
  if (t == "error") return Level::kError;
  if (t == "off") return Level::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("must be debug, info, warning, error or off, got '", text, "'"));
}

absl::string_view LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarning:
      return "warning";
    case Level::kError:
      return "error";
    case Level::kOff:
      return "off";
  }
  return "?";
}

void SetLogLevel(Level level) { CurrentLevel().store(static_cast<int>(level)); }
Level GetLogLevel() { return static_cast<Level>(CurrentLevel().load(std::memory_order_relaxed)); }

void SetSinkForTesting(Sink sink) { CurrentSink().store(sink); }

Line::Line(Level level, const char* file, int line) : level_(level) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E', 'O'};
  out_ << kLetters[static_cast<int>(level)]
       << absl::FormatTime("%Y%m%d %H:%M:%E6S", absl::Now(), absl::UTCTimeZone()) << ' '
       << Basename(file) << ':' << line << "] ";
}

Line::~Line() {
  (void)level_;
  out_ << '\n';
  const std::string text = out_.str();
  Sink sink = CurrentSink().load();
  if (sink != nullptr) {
    sink(text);
  } else {
    WriteToStderr(text);
  }
}

}  // namespace stagewise::log
