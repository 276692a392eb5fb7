#include "worker/stage_reporter.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/retry_policy.h"

namespace stagewise::worker {

StageReporter::StageReporter(std::function<void(v1::WorkerEvent)> emit, v1::WorkerEvent envelope,
                             bool last, metrics::StageMetrics* metrics)
    : emit_(std::move(emit)), envelope_(std::move(envelope)), last_(last), metrics_(metrics) {}

void StageReporter::Emit(v1::WorkerEvent event) const {
  if (emit_) emit_(std::move(event));
}

void StageReporter::Start() {
  absl::MutexLock lock(&mu_);
  loss_window_.Restart(training::LossWindow::Clock::now());
}

void StageReporter::Step(int64_t steps_done, int64_t total_steps, double train_loss,
                         int64_t samples) {
  if (!connected()) return;
  double seconds = 0;
  {
    absl::MutexLock lock(&mu_);
    const std::optional<training::LossWindow::Report> report =
        loss_window_.Add(train_loss, steps_done == total_steps, training::LossWindow::Clock::now());
    if (!report.has_value()) return;
    train_loss = report->mean_loss;
    seconds = report->seconds;
  }
  v1::WorkerEvent event = NewEvent();
  auto* m = event.mutable_metrics();
  m->set_step(steps_done);
  if (last_) (*m->mutable_values())["train_loss"] = train_loss;
  (*m->mutable_values())["samples"] = static_cast<double>(samples);
  (*m->mutable_values())["report_seconds"] = seconds;
  // Cumulative: the coordinator compares the stage's pace with its plan.
  (*m->mutable_values())["compute_seconds"] = metrics_->compute_seconds();
  Emit(std::move(event));
}

void StageReporter::Eval(int64_t steps_done, double loss, double accuracy, int64_t samples) const {
  if (!connected()) return;
  v1::WorkerEvent event = NewEvent();
  auto* m = event.mutable_metrics();
  m->set_step(steps_done);
  (*m->mutable_values())["eval_loss"] = loss;
  (*m->mutable_values())["eval_accuracy"] = accuracy;
  (*m->mutable_values())["eval_samples"] = static_cast<double>(samples);
  Emit(std::move(event));
}

void StageReporter::Summarize(const std::string& key, double value) {
  absl::MutexLock lock(&mu_);
  summary_[key] = value;
}

void StageReporter::CountSent(v1::StageMessage::Kind kind, int64_t size) {
  metrics_->AddBytes(true, size);
  if (kind != v1::StageMessage::FORWARD && kind != v1::StageMessage::BACKWARD) return;
  const std::string name = kind == v1::StageMessage::FORWARD ? "forward" : "backward";
  metrics_->SetMessageBytes(name, size);
  absl::MutexLock lock(&mu_);
  double& largest = summary_[name + "_message_bytes"];
  largest = std::max(largest, static_cast<double>(size));
  summary_[name + "_bytes_sent"] += static_cast<double>(size);
}

void StageReporter::Finish(const absl::Status& status, int64_t total_steps, int stage) {
  if (!connected()) return;
  v1::WorkerEvent event = NewEvent();
  if (status.ok()) {
    auto* r = event.mutable_result();
    (*r->mutable_values())["steps"] = static_cast<double>(total_steps);
    (*r->mutable_values())["bytes_sent"] = static_cast<double>(metrics_->bytes(true));
    (*r->mutable_values())["bytes_received"] = static_cast<double>(metrics_->bytes(false));
    (*r->mutable_values())["idle_seconds"] = metrics_->idle_seconds();
    absl::MutexLock lock(&mu_);
    for (const auto& [key, value] : summary_) (*r->mutable_values())[key] = value;
  } else {
    auto* e = event.mutable_error();
    e->set_code(static_cast<int>(status.code()));
    // A peer or the network went away: another attempt may well succeed.
    e->set_retryable(IsTransient(status));
    e->set_neighbour_stream(IsNeighbourStreamError(status));
    e->set_message(absl::StrCat("stage ", stage, ": ", status.message()));
  }
  Emit(std::move(event));
}

}  // namespace stagewise::worker
