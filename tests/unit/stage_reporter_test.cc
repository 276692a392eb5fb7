// What a stage tells the coordinator (worker/stage_reporter.h): step reports
// paced and carrying the mean loss since the previous one, the last step
// always reported, the summary in the result, errors named and classified.
#include "worker/stage_reporter.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/match.h"

namespace stagewise::worker {
namespace {

class StageReporterTest : public ::testing::Test {
 protected:
  StageReporter Make(bool last) {
    v1::WorkerEvent envelope;
    envelope.set_job_id("job-1");
    envelope.set_stage(last ? 1 : 0);
    envelope.set_attempt(3);
    return StageReporter([this](v1::WorkerEvent e) { events_.push_back(std::move(e)); }, envelope,
                         last, &metrics_);
  }
  prometheus::Registry registry_;
  metrics::StageMetrics metrics_{registry_, "job-1", 1, "backprop"};
  std::vector<v1::WorkerEvent> events_;
};

TEST_F(StageReporterTest, StepsArePacedAndCarryTheMeanLossSinceTheLastReport) {
  StageReporter r = Make(/*last=*/true);
  r.Start();
  const std::vector<std::pair<int64_t, double>> steps = {{1, 1.0}, {2, 3.0}, {10, 5.0}};
  for (const auto& [step, loss] : steps) r.Step(step, 10, loss, 16);
  // Steps within 0.25 s of the previous report are held back (how many were
  // depends on the machine's pace); the last step is always reported, with
  // the mean loss of the steps since the report before it.
  ASSERT_GE(events_.size(), 1u);
  ASSERT_LE(events_.size(), steps.size());
  const v1::WorkerEvent& e = events_.back();
  EXPECT_EQ(e.job_id(), "job-1");
  EXPECT_EQ(e.attempt(), 3);
  EXPECT_EQ(e.metrics().step(), 10);
  EXPECT_EQ(e.metrics().values().count("compute_seconds"), 1u);
  const int64_t previous = events_.size() > 1 ? events_[events_.size() - 2].metrics().step() : 0;
  double sum = 0;
  int count = 0;
  for (const auto& [step, loss] : steps) {
    if (step > previous) {
      sum += loss;
      ++count;
    }
  }
  EXPECT_DOUBLE_EQ(e.metrics().values().at("train_loss"), sum / count);
}

// The window itself (services/training/loss_window.h), which train-local's
// train_loss shares, on a clock the test controls.
TEST(LossWindowTest, ReportsTheMeanSinceThePreviousReportEveryPeriodAndAtTheLastStep) {
  using training::LossWindow;
  const LossWindow::Clock::time_point t0{};
  auto at = [&](double seconds) {
    return t0 + std::chrono::duration_cast<LossWindow::Clock::duration>(
                    std::chrono::duration<double>(seconds));
  };
  LossWindow w(t0);
  EXPECT_FALSE(w.Add(1.0, /*last=*/false, at(0.1)).has_value());
  EXPECT_FALSE(w.Add(3.0, false, at(0.2)).has_value());
  auto r = w.Add(5.0, false, at(0.3));  // the period has passed
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->mean_loss, 3.0);
  EXPECT_EQ(r->steps, 3);
  EXPECT_NEAR(r->seconds, 0.3, 1e-9);
  // A new window opens at the report: 0.2 s later is not due yet.
  EXPECT_FALSE(w.Add(2.0, false, at(0.5)).has_value());
  r = w.Add(4.0, /*last=*/true, at(0.51));  // the last step always reports
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->mean_loss, 3.0);
  EXPECT_EQ(r->steps, 2);
  // Restart moves the pacing, not the steps.
  w.Restart(at(1.0));
  EXPECT_FALSE(w.Add(7.0, false, at(1.2)).has_value());
  r = w.Add(9.0, false, at(1.25));
  ASSERT_TRUE(r.has_value());
  EXPECT_DOUBLE_EQ(r->mean_loss, 8.0);
}

TEST_F(StageReporterTest, OnlyTheLastStageReportsTheLoss) {
  StageReporter r = Make(/*last=*/false);
  r.Step(4, 4, 2.0, 16);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].metrics().values().count("train_loss"), 0u);
  EXPECT_EQ(events_[0].metrics().values().at("samples"), 16);
}

TEST_F(StageReporterTest, TheResultCarriesTheSummaryAndErrorsAreClassified) {
  StageReporter r = Make(/*last=*/true);
  r.Summarize("peak_memory_bytes", 42);
  r.CountSent(v1::StageMessage::FORWARD, 100);
  r.CountSent(v1::StageMessage::FORWARD, 300);
  r.Finish(absl::OkStatus(), 10, 1);
  ASSERT_EQ(events_.size(), 1u);
  const auto& values = events_[0].result().values();
  EXPECT_EQ(values.at("steps"), 10);
  EXPECT_EQ(values.at("peak_memory_bytes"), 42);
  EXPECT_EQ(values.at("forward_message_bytes"), 300);
  EXPECT_EQ(values.at("forward_bytes_sent"), 400);
  r.Finish(absl::UnavailableError("the stream to stage 2 broke"), 10, 1);
  r.Finish(absl::InvalidArgumentError("bad tensor"), 10, 1);
  ASSERT_EQ(events_.size(), 3u);
  EXPECT_TRUE(events_[1].error().retryable());
  EXPECT_TRUE(absl::StartsWith(events_[1].error().message(), "stage 1: "))
      << events_[1].error().message();
  EXPECT_FALSE(events_[2].error().retryable());
}

TEST_F(StageReporterTest, WithoutACoordinatorNothingIsSent) {
  v1::WorkerEvent envelope;
  StageReporter r(nullptr, envelope, true, &metrics_);
  EXPECT_FALSE(r.connected());
  r.Step(1, 1, 1.0, 1);
  r.Eval(1, 1.0, 0.5, 1);
  r.Emit(r.NewEvent());
  r.Finish(absl::OkStatus(), 1, 0);
  EXPECT_TRUE(events_.empty());
}

}  // namespace
}  // namespace stagewise::worker
