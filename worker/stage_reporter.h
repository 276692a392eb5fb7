// What a stage tells the coordinator (WorkerEvent): its steps (rate-limited,
// the last stage with the mean training loss since its previous report),
// evaluations, the values of its summary, and at the end its result or its
// error. Every event carries the stage's envelope (job, stage, attempt,
// replica). Without an `emit` function (a stage run without a coordinator)
// nothing is sent, but the summary is kept. Thread-safe.
#ifndef STAGEWISE_WORKER_STAGE_REPORTER_H_
#define STAGEWISE_WORKER_STAGE_REPORTER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/metrics/metrics.h"
#include "services/training/loss_window.h"
#include "stagewise/v1/coordinator.pb.h"
#include "stagewise/v1/stage.pb.h"

namespace stagewise::worker {

class StageReporter {
 public:
  // `envelope`: the job, stage, attempt and replica every event names;
  // `last`: the job's last stage (it reports the training loss). `metrics`
  // must outlive the reporter.
  StageReporter(std::function<void(v1::WorkerEvent)> emit, v1::WorkerEvent envelope, bool last,
                metrics::StageMetrics* metrics);

  bool connected() const { return emit_ != nullptr; }
  // A new event with the stage's envelope, and sending one (nothing when
  // not connected).
  v1::WorkerEvent NewEvent() const { return envelope_; }
  void Emit(v1::WorkerEvent event) const;

  // The stage starts: step reports are paced from now.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // After global step `steps_done` of `total_steps`: every stage reports its
  // step (the coordinator tracks the slowest) at most every 0.25 s and at
  // the last step; the last stage adds the mean loss of the steps since its
  // previous report (training::LossWindow, as train-local's train_loss).
  void Step(int64_t steps_done, int64_t total_steps, double train_loss, int64_t samples)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Eval(int64_t steps_done, double loss, double accuracy, int64_t samples) const;

  // A value for the job summary (later calls overwrite).
  void Summarize(const std::string& key, double value) ABSL_LOCKS_EXCLUDED(mu_);
  // A message sent: bytes, and for FORWARD/BACKWARD the message size (metric)
  // and the largest size and total (summary).
  void CountSent(v1::StageMessage::Kind kind, int64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // The end: the result (steps, traffic, idle time and the summary) when
  // `status` is OK, else the error (retryable when transient), named after
  // `stage`.
  void Finish(const absl::Status& status, int64_t total_steps, int stage) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::function<void(v1::WorkerEvent)> emit_;
  const v1::WorkerEvent envelope_;
  const bool last_;
  metrics::StageMetrics* const metrics_;
  mutable absl::Mutex mu_;
  training::LossWindow loss_window_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> summary_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_REPORTER_H_
