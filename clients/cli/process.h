// Supervision of child processes for `stagewise local`: spawn with fork/execv
// (no shell), each child in its own process group and killed by the kernel if
// the spawning thread dies (PR_SET_PDEATHSIG); poll, terminate and reap.
#ifndef STAGEWISE_CLIENTS_CLI_PROCESS_H_
#define STAGEWISE_CLIENTS_CLI_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagewise::cli {

// One child process. Thread-safe: a supervising thread may poll IsRunning()
// while another thread waits on the same child. The destructor kills and reaps
// a child that is still running, so a Child never outlives its owner.
class Child {
 public:
  // Starts argv[0] (a path; PATH is not searched) with argv, stdin from
  // /dev/null and stdout+stderr appended to `log_path` (created 0644). The
  // child gets its own process group, SIGTERM when the spawning *thread* exits
  // (spawn from the main thread), default signal dispositions and an empty
  // signal mask. Fails (and leaves nothing running) if the log cannot be
  // opened or execv fails, with the errno text.
  static absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::vector<std::string>& argv,
                                                      const std::string& log_path);

  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }  // basename of argv[0]
  const std::string& log_path() const { return log_path_; }

  // Reaps the child if it has exited (waitpid WNOHANG); false once it has.
  bool IsRunning() const;
  // The raw wait status (as from waitpid) once the child has exited.
  std::optional<int> ExitStatus() const;
  // "running", "exited with code 3", "killed by signal 9 (Killed)".
  std::string DescribeExit() const;

  // SIGTERM to the child's process group, up to `timeout` for it to exit,
  // then SIGKILL; always reaps. OK if it was already gone.
  absl::Status Terminate(absl::Duration timeout);

  // Sends `signo` to the child's process group while it is running.
  void Signal(int signo);

  // SIGKILL to the child's process group (no grace: `local --chaos`), then
  // waits for it and reaps it. Returns its wait status (as DescribeExit shows).
  int Kill();

 private:
  Child(pid_t pid, std::string name, std::string log_path);
  // Requires mu_. Calls waitpid with `flags`; records the status if reaped.
  void ReapLocked(int flags) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const pid_t pid_;
  const std::string name_;
  const std::string log_path_;
  mutable absl::Mutex mu_;
  mutable std::optional<int> wait_status_ ABSL_GUARDED_BY(mu_);
};

// Terminates all of `children` concurrently: SIGTERM to every one, a shared
// `timeout` for them to exit, then SIGKILL to the rest; reaps them all.
// Returns the children that had to be SIGKILLed.
std::vector<Child*> TerminateAll(const std::vector<Child*>& children, absl::Duration timeout);

// Human text for a raw wait status: "exited with code 3", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

struct Ports {
  int grpc = 0;
  int metrics = 0;
};

// Parses a port file's text, "GRPC_PORT METRICS_PORT\n" (both in 1..65535;
// the metrics port may be 0 when a process serves no metrics).
absl::StatusOr<Ports> ParsePortFile(const std::string& text);

// Waits until `path` exists and parses (the writer renames it into place once
// it is serving). Fails early, naming the child and its exit status, if `child`
// exits first; DEADLINE_EXCEEDED after `timeout`; CANCELLED once `*abort` is
// set (when given).
absl::StatusOr<Ports> WaitForPortFile(const std::string& path, absl::Duration timeout,
                                      const Child& child, const std::atomic<bool>* abort = nullptr);

// The last `max_lines` lines of a text file ("" if it cannot be read).
std::string TailFile(const std::string& path, int max_lines);

// Finds an executable: first in `preferred_dir` (when not empty), then in each
// directory of $PATH. NOT_FOUND otherwise.
absl::StatusOr<std::string> FindExecutable(const std::string& name,
                                           const std::string& preferred_dir);

// The directory holding the running executable (/proc/self/exe), "" if unknown.
std::string SelfExecutableDir();

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_PROCESS_H_
