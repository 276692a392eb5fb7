#include "clients/cli/job_watch.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cli/commands.h"
#include "clients/cli/format.h"
#include "clients/cli/job_format.h"

namespace stagewise::cli {

ProgressDisplay::ProgressDisplay(std::ostream& err, bool tty, bool quiet)
    : err_(err), tty_(tty), quiet_(quiet) {}

std::optional<double> ProgressDisplay::Eta(const v1::JobStatus& s, absl::Time now) {
  if (s.state() != v1::RUNNING || s.total_steps() <= 0) return std::nullopt;
  // Recovery may move the step back: measure the rate afresh from there.
  if (!rate_since_.has_value() || s.step() < rate_since_step_) {
    rate_since_ = now;
    rate_since_step_ = s.step();
    return std::nullopt;
  }
  const double seconds = absl::ToDoubleSeconds(now - *rate_since_);
  const int64_t steps = s.step() - rate_since_step_;
  if (steps <= 0 || seconds <= 0) return std::nullopt;
  return static_cast<double>(s.total_steps() - s.step()) * seconds / static_cast<double>(steps);
}

void ProgressDisplay::OnEvent(const v1::JobEvent& event, absl::Time now) {
  const std::optional<double> eta = Eta(event.status(), now);
  if (quiet_) return;
  if (!event.message().empty() && event.message() != last_message_) {
    last_message_ = event.message();
    Note(absl::StrCat(client::JobStateName(event.status().state()), ": ",
                      TerminalSafe(event.message())));
  }
  const std::string line = JobProgressLine(event.status(), eta);
  if (tty_) {
    err_ << "\r\033[K" << line;
    line_open_ = true;
  } else if (line != last_line_) {
    // Logs (CI, kubectl logs) get a line per state change and one every
    // kLogEvery while running, not one per progress report.
    const bool state_changed = event.status().state() != last_state_;
    if (state_changed || client::IsTerminal(event.status().state()) || !last_printed_ ||
        now - *last_printed_ >= kLogEvery) {
      err_ << line << "\n";
      last_printed_ = now;
    }
  }
  last_state_ = event.status().state();
  last_line_ = line;
  err_.flush();
}

void ProgressDisplay::Note(const std::string& text) {
  if (quiet_) return;
  if (line_open_) err_ << "\r\033[K";
  err_ << text << "\n";
  line_open_ = false;
  if (tty_ && !last_line_.empty()) {  // put the progress line back under it
    err_ << last_line_;
    line_open_ = true;
  }
  err_.flush();
}

void ProgressDisplay::Finish() {
  if (line_open_) err_ << "\n";
  line_open_ = false;
  err_.flush();
}

absl::StatusOr<v1::JobStatus> WatchWithProgress(client::CoordinatorClient& client,
                                                const std::string& job_id,
                                                const WatchOptions& options, std::ostream& err) {
  const bool tty = &err == &std::cerr && isatty(fileno(stderr)) != 0;
  ProgressDisplay display(err, tty, options.quiet);
  absl::StatusOr<v1::JobStatus> result = client.WatchReconnecting(
      job_id,
      [&](const v1::JobEvent& e) {
        display.OnEvent(e, absl::Now());
        if (options.after_event) {
          for (const std::string& line : options.after_event(e)) display.Note(line);
        }
        return true;
      },
      options.reconnect,
      [&](const client::ConnectionChange& change) {
        if (change.lost) {
          display.Note(absl::StrCat("coordinator unavailable (", change.reason, "); reconnecting"));
        } else {
          display.Note(absl::StrCat("reconnected (after ",
                                    HumanDuration(absl::ToDoubleSeconds(change.down_for)), ")"));
        }
      });
  display.Finish();
  return result;
}

absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text, const std::string& flag) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds) && std::isfinite(seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": expected a duration such as 10m, 90s or 1h30m (or seconds), got \"", text, "\""));
  }
  if (d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": must not be negative, got ", text));
  }
  return d;
}

int ReportResult(const v1::JobStatus& status, const std::string& output, std::ostream& out,
                 std::ostream& err) {
  if (output == "json") {
    out << JobJson(status) << "\n";
  } else {
    out << JobTable(status);
  }
  out.flush();
  if (status.state() == v1::SUCCEEDED) return kExitOk;
  err << "job " << status.job_id() << " " << client::JobStateName(status.state());
  if (!status.reason().empty()) err << ": " << TerminalSafe(status.reason());
  err << "\n";
  return kExitFailed;
}

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
      return kExitInvalid;
    case absl::StatusCode::kUnavailable:
      return kExitUnreachable;
    default:
      return kExitFailed;
  }
}

int ReportError(const absl::Status& status, std::ostream& err) {
  err << "error: " << TerminalSafe(status.message()) << "\n";
  return ExitCodeFor(status);
}

}  // namespace stagewise::cli
