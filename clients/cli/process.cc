#include "clients/cli/process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace stagewise::cli {
namespace {

// Poll period of the wait loops: short enough to feel instant, long enough to
// cost nothing.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// What a failed child writes to the parent before _exit: which step failed and errno.
struct ExecFailure {
  int step;  // 0 = execv
  int error;
};

// Runs in the forked child: only async-signal-safe calls until execv.
[[noreturn]] void ExecChild(char* const* argv, int log_fd, int null_fd, int error_fd,
                            pid_t parent) {
  ::setpgid(0, 0);
  // Die with the CLI even if it is SIGKILLed. If the parent is already gone,
  // the signal would never come: exit instead.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(127);
  // The CLI blocks SIGINT/SIGTERM to handle them on one thread; execv would
  // keep that mask, and ignored signals stay ignored across execv.
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD, SIGUSR1, SIGUSR2}) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    ::sigaction(sig, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::dup2(null_fd, STDIN_FILENO);
  ::dup2(log_fd, STDOUT_FILENO);
  ::dup2(log_fd, STDERR_FILENO);
  // Keep none of the CLI's descriptors (sockets, files) in the child; the
  // error pipe is close-on-exec already and stays usable until execv.
  ::syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execv(argv[0], argv);
  ExecFailure failure{0, errno};
  [[maybe_unused]] ssize_t n = ::write(error_fd, &failure, sizeof(failure));
  ::_exit(127);
}

}  // namespace

std::string DescribeWaitStatus(int wait_status) {
  if (wait_status < 0) return "exited (status unknown: reaped elsewhere)";
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* name = ::strsignal(sig);
    return absl::StrCat("killed by signal ", sig,
                        name != nullptr ? absl::StrCat(" (", name, ")") : "",
                        WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return absl::StrCat("stopped (wait status ", wait_status, ")");
}

absl::StatusOr<std::unique_ptr<Child>> Child::Spawn(const std::vector<std::string>& argv,
                                                    const std::string& log_path) {
  if (argv.empty() || argv[0].empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open log file ", log_path, ": ", std::strerror(errno)));
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int pipe_fds[2];
  if (null_fd < 0 || ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    return absl::InternalError(absl::StrCat("cannot spawn ", argv[0], ": ", std::strerror(e)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) ExecChild(cargv.data(), log_fd, null_fd, pipe_fds[1], parent);
  const int fork_errno = errno;
  ::close(log_fd);
  ::close(null_fd);
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot fork for ", argv[0], ": ", std::strerror(fork_errno)));
  }
  // Also here, so the group exists before we may signal it (the child's own
  // call might not have run yet). EACCES after its execv is fine.
  ::setpgid(pid, pid);

  ExecFailure failure{};
  ssize_t n;
  do {
    n = ::read(pipe_fds[0], &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  ::close(pipe_fds[0]);
  if (n > 0) {  // execv failed; the child has exited or is about to
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", argv[0], ": ", std::strerror(failure.error)));
  }
  return std::unique_ptr<Child>(new Child(pid, Basename(argv[0]), log_path));
}

Child::Child(pid_t pid, std::string name, std::string log_path)
    : pid_(pid), name_(std::move(name)), log_path_(std::move(log_path)) {}

Child::~Child() { Terminate(absl::Seconds(1)).IgnoreError(); }

void Child::ReapLocked(int flags) const {
  if (wait_status_.has_value()) return;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, flags);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    wait_status_ = status;
  } else if (r < 0 && errno == ECHILD) {
    wait_status_ = -1;  // someone else reaped it
  }
}

bool Child::IsRunning() const {
  absl::MutexLock lock(&mu_);
  ReapLocked(WNOHANG);
  return !wait_status_.has_value();
}

std::optional<int> Child::ExitStatus() const {
  absl::MutexLock lock(&mu_);
  ReapLocked(WNOHANG);
  return wait_status_;
}

std::string Child::DescribeExit() const {
  const std::optional<int> status = ExitStatus();
  return status.has_value() ? DescribeWaitStatus(*status) : "running";
}

void Child::Signal(int signo) {
  absl::MutexLock lock(&mu_);
  ReapLocked(WNOHANG);
  // Never signal a reaped pid: the number may belong to someone else now.
  if (wait_status_.has_value()) return;
  if (::kill(-pid_, signo) != 0) ::kill(pid_, signo);
}

absl::Status Child::Terminate(absl::Duration timeout) {
  if (!IsRunning()) return absl::OkStatus();
  Signal(SIGTERM);
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (!IsRunning()) return absl::OkStatus();
    absl::SleepFor(kPollInterval);
  }
  Signal(SIGKILL);
  absl::MutexLock lock(&mu_);
  ReapLocked(0);
  return absl::OkStatus();
}

int Child::Kill() {
  Signal(SIGKILL);
  absl::MutexLock lock(&mu_);
  ReapLocked(0);
  return wait_status_.value_or(-1);
}

std::vector<Child*> TerminateAll(const std::vector<Child*>& children, absl::Duration timeout) {
  for (Child* c : children) c->Signal(SIGTERM);
  const absl::Time end = absl::Now() + timeout;
  std::vector<Child*> running = children;
  while (true) {
    running.erase(
        std::remove_if(running.begin(), running.end(), [](Child* c) { return !c->IsRunning(); }),
        running.end());
    if (running.empty() || absl::Now() >= end) break;
    absl::SleepFor(kPollInterval);
  }
  for (Child* c : running) c->Terminate(absl::ZeroDuration()).IgnoreError();
  return running;
}

absl::StatusOr<Ports> ParsePortFile(const std::string& text) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  Ports ports;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &ports.grpc) ||
      !absl::SimpleAtoi(parts[1], &ports.metrics) || ports.grpc <= 0 || ports.grpc > 65535 ||
      ports.metrics < 0 || ports.metrics > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected \"GRPC_PORT METRICS_PORT\", got \"", absl::CEscape(text), "\""));
  }
  return ports;
}

absl::StatusOr<Ports> WaitForPortFile(const std::string& path, absl::Duration timeout,
                                      const Child& child, const std::atomic<bool>* abort) {
  const absl::Time end = absl::Now() + timeout;
  absl::Status parse_error;
  while (true) {
    if (abort != nullptr && abort->load()) {
      return absl::CancelledError(absl::StrCat("stopped waiting for ", path));
    }
    if (!child.IsRunning()) {
      return absl::FailedPreconditionError(absl::StrCat(child.name(), " (pid ", child.pid(), ") ",
                                                        child.DescribeExit(),
                                                        " before writing its port file ", path));
    }
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      absl::StatusOr<Ports> ports = ParsePortFile(text.str());
      if (ports.ok()) return ports;
      parse_error = ports.status();  // maybe caught mid-write; retry
    }
    if (absl::Now() >= end) break;
    absl::SleepFor(kPollInterval);
  }
  if (!parse_error.ok()) {
    return absl::DataLossError(
        absl::StrCat("malformed port file ", path, ": ", parse_error.message()));
  }
  return absl::DeadlineExceededError(absl::StrCat(child.name(), " (pid ", child.pid(),
                                                  ") did not write its port file ", path,
                                                  " within ", absl::FormatDuration(timeout)));
}

std::string TailFile(const std::string& path, int max_lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in || max_lines <= 0) return "";
  // Logs can be long: only the end matters.
  constexpr std::streamoff kMaxBytes = 64 << 10;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(size > kMaxBytes ? size - kMaxBytes : 0);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (size > kMaxBytes && !lines.empty()) lines.erase(lines.begin());  // partial first line
  if (static_cast<int>(lines.size()) > max_lines) {
    lines.erase(lines.begin(), lines.end() - max_lines);
  }
  return absl::StrJoin(lines, "\n");
}

absl::StatusOr<std::string> FindExecutable(const std::string& name,
                                           const std::string& preferred_dir) {
  if (name.find('/') != std::string::npos) {
    if (IsExecutableFile(name)) return name;
    return absl::NotFoundError(absl::StrCat(name, " is not an executable file"));
  }
  if (!preferred_dir.empty()) {
    const std::string candidate = absl::StrCat(preferred_dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  const char* path_env = std::getenv("PATH");
  if (path_env != nullptr) {
    for (absl::string_view dir : absl::StrSplit(path_env, ':')) {
      const std::string candidate =
          absl::StrCat(dir.empty() ? absl::string_view(".") : dir, "/", name);
      if (IsExecutableFile(candidate)) return candidate;
    }
  }
  return absl::NotFoundError(absl::StrCat(name, " not found", preferred_dir.empty() ? "" : " in ",
                                          preferred_dir, " or on PATH"));
}

std::string SelfExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return Dirname(std::string(buf, static_cast<size_t>(n)));
}

}  // namespace stagewise::cli
