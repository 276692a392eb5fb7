// Scrape (a minimal HTTP/1.0 client over POSIX sockets) and FindSample (a
// parser for Prometheus text exposition lines).
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/metrics/metrics.h"

namespace stagewise::metrics {
namespace {

constexpr absl::Duration kDefaultScrapeTimeout = absl::Seconds(5);

// Closes a file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Milliseconds left until `deadline` for poll(), at least 0.
int RemainingMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, std::numeric_limits<int>::max()));
}

// Waits for `events` on `fd`; false with *status set on timeout or error.
bool WaitFor(int fd, short events, absl::Time deadline, const std::string& where,
             absl::Status* status) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    const int n = poll(&pfd, 1, RemainingMs(deadline));
    if (n > 0) return true;
    if (n == 0) {
      *status = absl::DeadlineExceededError(absl::StrCat("scrape ", where, ": timed out"));
      return false;
    }
    if (errno != EINTR) {
      *status = absl::UnavailableError(absl::StrCat("scrape ", where, ": poll: ", strerror(errno)));
      return false;
    }
  }
}

// Unescapes a label value (\\, \", \n); `in` starts after the opening quote.
// Returns the position after the closing quote or npos.
size_t ParseQuoted(absl::string_view in, size_t pos, std::string* out) {
  out->clear();
  while (pos < in.size()) {
    const char c = in[pos];
    if (c == '"') return pos + 1;
    if (c == '\\') {
      if (pos + 1 >= in.size()) return absl::string_view::npos;
      const char e = in[pos + 1];
      out->push_back(e == 'n' ? '\n' : e);
      pos += 2;
      continue;
    }
    out->push_back(c);
    ++pos;
  }
  return absl::string_view::npos;
}

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_' || c == ':'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == ':'; }

size_t SkipSpaces(absl::string_view in, size_t pos) {
  while (pos < in.size() && (in[pos] == ' ' || in[pos] == '\t')) ++pos;
  return pos;
}

bool ParseValue(absl::string_view token, double* value) {
  if (absl::EqualsIgnoreCase(token, "+Inf") || absl::EqualsIgnoreCase(token, "Inf")) {
    *value = std::numeric_limits<double>::infinity();
    return true;
  }
  if (absl::EqualsIgnoreCase(token, "-Inf")) {
    *value = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (absl::EqualsIgnoreCase(token, "NaN")) {
    *value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (!token.empty() && token.front() == '+') token.remove_prefix(1);
  return absl::SimpleAtod(token, value);
}

struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

// Parses one sample line `name{k="v",...} value [timestamp]`; false for
// comments, blank and malformed lines.
bool ParseSampleLine(absl::string_view line, Sample* sample) {
  size_t pos = SkipSpaces(line, 0);
  if (pos >= line.size() || line[pos] == '#' || !IsNameStart(line[pos])) return false;
  const size_t name_start = pos;
  while (pos < line.size() && IsNameChar(line[pos])) ++pos;
  sample->name = std::string(line.substr(name_start, pos - name_start));
  sample->labels.clear();
  pos = SkipSpaces(line, pos);
  if (pos < line.size() && line[pos] == '{') {
    ++pos;
    for (;;) {
      pos = SkipSpaces(line, pos);
      if (pos >= line.size()) return false;
      if (line[pos] == '}') {
        ++pos;
        break;
      }
      if (!IsNameStart(line[pos])) return false;
      const size_t key_start = pos;
      while (pos < line.size() && IsNameChar(line[pos])) ++pos;
      std::string key(line.substr(key_start, pos - key_start));
      pos = SkipSpaces(line, pos);
      if (pos >= line.size() || line[pos] != '=') return false;
      pos = SkipSpaces(line, pos + 1);
      if (pos >= line.size() || line[pos] != '"') return false;
      std::string value;
      pos = ParseQuoted(line, pos + 1, &value);
      if (pos == absl::string_view::npos) return false;
      sample->labels.emplace_back(std::move(key), std::move(value));
      pos = SkipSpaces(line, pos);
      if (pos < line.size() && line[pos] == ',') ++pos;
    }
  }
  pos = SkipSpaces(line, pos);
  size_t end = pos;
  while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
  if (end == pos) return false;
  return ParseValue(line.substr(pos, end - pos), &sample->value);
}

bool LabelsMatch(const Sample& sample, const std::map<std::string, std::string>& wanted) {
  for (const auto& [key, value] : wanted) {
    bool found = false;
    for (const auto& [k, v] : sample.labels) {
      if (k == key) {
        found = v == value;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> Scrape(const std::string& host, int port) {
  return Scrape(host, port, kDefaultScrapeTimeout);
}

absl::StatusOr<std::string> Scrape(const std::string& host, int port, absl::Duration timeout) {
  const std::string where = absl::StrCat(host, ":", port);
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("scrape ", where, ": bad port"));
  }
  const absl::Time deadline = absl::Now() + timeout;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addrs = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &addrs); rc != 0) {
    return absl::UnavailableError(absl::StrCat("scrape ", where, ": resolve: ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("scrape ", where, ": no address"));
  int fd = -1;
  for (const addrinfo* ai = addrs; ai != nullptr; ai = ai->ai_next) {
    const int s =
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (s < 0) {
      last = absl::UnavailableError(absl::StrCat("scrape ", where, ": socket: ", strerror(errno)));
      continue;
    }
    int error = 0;
    if (connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        absl::Status status;
        if (!WaitFor(s, POLLOUT, deadline, where, &status)) {
          close(s);
          last = status;
          if (absl::IsDeadlineExceeded(status)) break;
          continue;
        }
        socklen_t len = sizeof(error);
        if (getsockopt(s, SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      }
    }
    if (error != 0) {
      close(s);
      last = absl::UnavailableError(absl::StrCat("scrape ", where, ": connect: ", strerror(error)));
      continue;
    }
    fd = s;
    break;
  }
  freeaddrinfo(addrs);
  if (fd < 0) return last;
  Fd guard(fd);

  const std::string request =
      absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", where, "\r\nAccept: text/plain\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::Status status;
      if (!WaitFor(fd, POLLOUT, deadline, where, &status)) return status;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("scrape ", where, ": send: ", strerror(errno)));
  }

  std::string response;
  char buffer[16384];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      response.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status status;
      if (!WaitFor(fd, POLLIN, deadline, where, &status)) return status;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("scrape ", where, ": recv: ", strerror(errno)));
  }

  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("scrape ", where, ": malformed HTTP response (", response.size(), " bytes)"));
  }
  const absl::string_view status_line =
      absl::string_view(response).substr(0, response.find("\r\n"));
  const std::vector<absl::string_view> parts = absl::StrSplit(status_line, ' ');
  int code = 0;
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/") ||
      !absl::SimpleAtoi(parts[1], &code)) {
    return absl::UnavailableError(
        absl::StrCat("scrape ", where, ": malformed status line '", status_line, "'"));
  }
  if (code != 200) {
    return absl::UnavailableError(absl::StrCat("scrape ", where, ": HTTP ", status_line));
  }
  return response.substr(header_end + 4);
}

absl::StatusOr<double> FindSample(const std::string& text, const std::string& name,
                                  const std::map<std::string, std::string>& labels) {
  Sample sample;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!ParseSampleLine(line, &sample)) continue;
    if (sample.name != name || !LabelsMatch(sample, labels)) continue;
    return sample.value;
  }
  std::string wanted = name;
  if (!labels.empty()) {
    wanted += "{";
    bool first = true;
    for (const auto& [key, value] : labels) {
      absl::StrAppend(&wanted, first ? "" : ",", key, "=\"", value, "\"");
      first = false;
    }
    wanted += "}";
  }
  return absl::NotFoundError(absl::StrCat("no sample ", wanted));
}

}  // namespace stagewise::metrics
