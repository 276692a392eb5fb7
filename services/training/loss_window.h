// The window a job's `train_loss` is the mean of, the same for a distributed
// job (the last stage's reports to the coordinator) and for `train-local`: the
// steps since the previous report, where a report is due once
// kReportPeriodSeconds have passed since the previous one, and at the last
// step. One step's loss is noise; a window of time is what a watcher sees
// refresh. Not thread-safe (callers lock).
#ifndef STAGEWISE_SERVICES_TRAINING_LOSS_WINDOW_H_
#define STAGEWISE_SERVICES_TRAINING_LOSS_WINDOW_H_

#include <chrono>
#include <cstdint>
#include <optional>

namespace stagewise::training {

class LossWindow {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kReportPeriodSeconds = 0.25;

  struct Report {
    double mean_loss = 0;  // over the window's steps
    int64_t steps = 0;     // in the window
    double seconds = 0;    // since the previous report (or Restart)
  };

  explicit LossWindow(Clock::time_point now = Clock::now()) : start_(now) {}

  // Pacing starts again from `now` (the steps so far stay in the window).
  void Restart(Clock::time_point now) { start_ = now; }

  // One step's loss. When a report is due (the period has passed, or `last`),
  // returns the window's mean and opens a new window at `now`.
  std::optional<Report> Add(double loss, bool last, Clock::time_point now) {
    sum_ += loss;
    ++steps_;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    if (seconds < kReportPeriodSeconds && !last) return std::nullopt;
    Report r{sum_ / static_cast<double>(steps_), steps_, seconds};
    sum_ = 0;
    steps_ = 0;
    start_ = now;
    return r;
  }

 private:
  Clock::time_point start_;
  double sum_ = 0;
  int64_t steps_ = 0;
};

}  // namespace stagewise::training

#endif  // STAGEWISE_SERVICES_TRAINING_LOSS_WINDOW_H_
