// What `submit`, `watch` and `local` share: following a job with a live
// progress line, printing its result, and turning errors into exit codes.
#ifndef STAGEWISE_CLIENTS_CLI_JOB_WATCH_H_
#define STAGEWISE_CLIENTS_CLI_JOB_WATCH_H_

#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/client/coordinator_client.h"

namespace stagewise::cli {

// Renders JobEvents on `err`: event messages as lines of their own, and the
// progress (state, epoch, step/total, loss, samples/s, ETA) refreshed in place
// with '\r' on a terminal, or one line per change otherwise.
class ProgressDisplay {
 public:
  ProgressDisplay(std::ostream& err, bool tty, bool quiet);
  void OnEvent(const v1::JobEvent& event, absl::Time now);
  // Prints `text` on a line of its own (above the in-place progress line on
  // a terminal). Nothing with `quiet`.
  void Note(const std::string& text);
  // Ends a pending in-place line so that what follows starts on its own line.
  void Finish();

 private:
  // Remaining time from the observed step rate since the first running event.
  std::optional<double> Eta(const v1::JobStatus& s, absl::Time now);

  std::ostream& err_;
  const bool tty_;
  const bool quiet_;
  bool line_open_ = false;  // an in-place line is on screen
  std::string last_line_;
  static constexpr absl::Duration kLogEvery = absl::Seconds(10);
  std::optional<absl::Time> last_printed_;
  v1::JobState last_state_ = v1::JOB_STATE_UNSPECIFIED;
  std::string last_message_;
  std::optional<absl::Time> rate_since_;
  int64_t rate_since_step_ = 0;
};

struct WatchOptions {
  bool quiet = false;
  // Reconnection when the coordinator goes away mid-watch (restart, network).
  client::ReconnectPolicy reconnect;
  // Runs after each event is shown (e.g. `local --chaos`); the lines it
  // returns are printed on lines of their own.
  std::function<std::vector<std::string>(const v1::JobEvent&)> after_event;
};

// Watches `job_id` with a ProgressDisplay until the job ends, the watch is
// stopped, or it breaks for good. A coordinator that goes away is waited for
// (options.reconnect), with one line when it is lost ("coordinator unavailable
// (REASON); reconnecting") and one when it is back ("reconnected (after 3s)").
absl::StatusOr<v1::JobStatus> WatchWithProgress(client::CoordinatorClient& client,
                                                const std::string& job_id,
                                                const WatchOptions& options, std::ostream& err);

// "10m", "90s", "1h30m" (absl::ParseDuration) or a plain number of seconds;
// "0" = never reconnect. INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text, const std::string& flag);

// Prints a finished (or any) job's status as a table or JSON on `out`, and
// the reason on `err` when it did not succeed. Returns kExitOk for SUCCEEDED,
// kExitFailed otherwise.
int ReportResult(const v1::JobStatus& status, const std::string& output, std::ostream& out,
                 std::ostream& err);

// kExitInvalid for INVALID_ARGUMENT, kExitUnreachable for UNAVAILABLE,
// kExitFailed for anything else.
int ExitCodeFor(const absl::Status& status);
// Prints "error: MESSAGE" on `err` and returns ExitCodeFor(status).
int ReportError(const absl::Status& status, std::ostream& err);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_JOB_WATCH_H_
