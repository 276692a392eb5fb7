#include "clients/cli/signal_watcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace stagewise::cli {
namespace {

// The write end of the active watcher's pipe, for the signal handler.
std::atomic<int> g_signal_pipe{-1};
struct sigaction g_old_int, g_old_term;

void OnSignal(int signo) {
  const int saved_errno = errno;
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signo);
    [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

// The byte that tells the thread to stop (no signal has number 0).
constexpr unsigned char kStop = 0;

}  // namespace

int ExitCodeForSignal(int signo) { return 128 + signo; }

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal, std::function<void()> on_tick,
                             absl::Duration tick)
    : on_signal_(std::move(on_signal)), on_tick_(std::move(on_tick)), tick_(tick) {
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    // Out of descriptors: keep the default dispositions (Ctrl-C kills us; the
    // children still get SIGTERM through PR_SET_PDEATHSIG).
    pipe_[0] = pipe_[1] = -1;
    return;
  }
  installed_ = true;
  g_signal_pipe.store(pipe_[1]);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  thread_ = std::thread([this] { Run(); });
}

SignalWatcher::~SignalWatcher() {
  if (!installed_) return;
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_signal_pipe.store(-1);
  [[maybe_unused]] ssize_t n = ::write(pipe_[1], &kStop, 1);
  if (thread_.joinable()) thread_.join();
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

void SignalWatcher::Run() {
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(tick_));
  while (true) {
    struct pollfd pfd = {pipe_[0], POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) > 0) {
      unsigned char byte;
      while (::read(pipe_[0], &byte, 1) == 1) {
        if (byte == kStop) return;
        int expected = 0;
        first_signal_.compare_exchange_strong(expected, byte);
        if (on_signal_) on_signal_(byte);
      }
    }
    if (on_tick_) on_tick_();
  }
}

}  // namespace stagewise::cli
