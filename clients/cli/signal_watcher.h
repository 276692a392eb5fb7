// SIGINT/SIGTERM handling for long-running CLI commands: the signal handler
// only writes the signal number to a pipe; a watcher thread reads it and runs
// the command's callback (cancel the job, stop watching), where any code may
// run. The same thread can poll something periodically (child processes).
#ifndef STAGEWISE_CLIENTS_CLI_SIGNAL_WATCHER_H_
#define STAGEWISE_CLIENTS_CLI_SIGNAL_WATCHER_H_

#include <atomic>
#include <functional>
#include <thread>

#include "absl/time/time.h"

namespace stagewise::cli {

class SignalWatcher {
 public:
  // Installs handlers for SIGINT and SIGTERM (previous ones are restored by
  // the destructor) and starts the thread. `on_signal(signo)` runs on that
  // thread for every signal; `on_tick()` (optional) every `tick`.
  // At most one SignalWatcher may exist at a time.
  SignalWatcher(std::function<void(int)> on_signal, std::function<void()> on_tick = nullptr,
                absl::Duration tick = absl::Milliseconds(100));
  ~SignalWatcher();  // stops the thread; no callback runs after it returns

  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // The first signal received, 0 if none.
  int first_signal() const { return first_signal_.load(); }

 private:
  void Run();

  std::function<void(int)> on_signal_;
  std::function<void()> on_tick_;
  absl::Duration tick_;
  std::atomic<int> first_signal_{0};
  int pipe_[2] = {-1, -1};
  bool installed_ = false;
  std::thread thread_;
};

// 128 + signo, the shell's convention for "ended by this signal".
int ExitCodeForSignal(int signo);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_SIGNAL_WATCHER_H_
