// `stagewise doctor` (clients/cli/doctor.h) on synthetic traces: it names the
// stage the others wait on, says so when none stands out, keeps only the
// latest attempt, and flags a stage that computes more than its plan.
#include "clients/cli/doctor.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace stagewise::cli {
namespace {

// Stage j: for each of `steps` mini-batches, `compute_ms` of forward and
// backward, then `wait_prev_ms` and `wait_next_ms` of waiting, back to back.
struct Shape {
  double compute_ms, wait_prev_ms, wait_next_ms;
};

v1::JobTrace Trace(const std::vector<Shape>& stages, int steps = 4, int attempt = 0) {
  v1::JobTrace t;
  t.set_name("sick");
  t.set_algorithm("backprop");
  t.set_num_stages(static_cast<int>(stages.size()));
  for (size_t j = 0; j < stages.size(); ++j) {
    v1::StageTrace* st = t.add_stages();
    st->set_stage(static_cast<int>(j));
    st->set_attempt(attempt);
    int64_t at = 1'000'000;
    auto span = [&](v1::SpanKind kind, double ms, int step) {
      if (ms <= 0) return;
      v1::Span* s = st->add_spans();
      s->set_kind(kind);
      s->set_start_us(at);
      s->set_duration_us(static_cast<int64_t>(ms * 1e3));
      s->set_step(step);
      s->set_micro_batch(step % 3);
      at += s->duration_us();
    };
    for (int step = 0; step < steps; ++step) {
      span(v1::SPAN_FORWARD, stages[j].compute_ms / 3, 100 + step);
      span(v1::SPAN_WAIT_PREV, stages[j].wait_prev_ms, 100 + step);
      span(v1::SPAN_BACKWARD, 2 * stages[j].compute_ms / 3, 100 + step);
      span(v1::SPAN_WAIT_NEXT, stages[j].wait_next_ms, 100 + step);
    }
  }
  return t;
}

TEST(Doctor, NamesTheStageTheOthersWaitOn) {
  // Stage 1 computes 30 ms per mini-batch, its neighbours 10 ms and wait.
  const v1::JobTrace t = Trace({{10, 0, 20}, {30, 0, 0}, {10, 20, 0}});
  const Diagnosis d = Diagnose(t, {});
  ASSERT_EQ(d.stages.size(), 3u);
  EXPECT_EQ(d.bottleneck, 1);
  EXPECT_NEAR(d.stages[1].busy, 1.0, 1e-9);
  EXPECT_NEAR(d.stages[0].wait_next, 2.0 / 3, 1e-3);
  EXPECT_NEAR(d.stages[1].compute_ms_per_batch, 30, 1e-3);
  EXPECT_EQ(d.stages[2].longest_kind, v1::SPAN_WAIT_PREV);
  EXPECT_NEAR(d.stages[2].longest_ms, 20, 1e-3);
  const std::string text = DiagnosisText(t, d, {"w0", "w1", "w2"});
  EXPECT_NE(text.find("bottleneck: stage 1 (on w1)"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 0 waits for its gradients 66.7%"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 2 waits for its activations 66.7%"), std::string::npos) << text;
  EXPECT_NE(text.find("20.0 ms for stage 1's activation of 100.1"), std::string::npos) << text;
  EXPECT_NE(text.find("mini-batches 100-103, 3 stages"), std::string::npos) << text;
}

TEST(Doctor, SaysSoWhenNoStageStandsOut) {
  const v1::JobTrace t = Trace({{10, 0, 4}, {10, 2, 2}, {10, 4, 0}});
  const Diagnosis d = Diagnose(t, {});
  EXPECT_EQ(d.bottleneck, -1);
  const std::string text = DiagnosisText(t, d, {});
  EXPECT_NE(text.find("no stage stands out"), std::string::npos) << text;
  EXPECT_EQ(text.find("bottleneck"), std::string::npos) << text;
}

TEST(Doctor, ReadsTheLatestAttemptAndComparesWithThePlan) {
  v1::JobTrace t = Trace({{10, 0, 20}, {30, 0, 0}}, 4, 0);
  // Attempt 1 of both stages: balanced, stage 1 at 20 ms per mini-batch.
  const v1::JobTrace later = Trace({{20, 0, 0}, {20, 0, 0}}, 4, 1);
  for (const v1::StageTrace& st : later.stages()) *t.add_stages() = st;
  const std::map<std::string, double> summary = {{"plan.stage0.seconds_per_batch", 0.019},
                                                 {"plan.stage1.seconds_per_batch", 0.010}};
  const Diagnosis d = Diagnose(t, summary);
  ASSERT_EQ(d.stages.size(), 2u);
  EXPECT_EQ(d.bottleneck, -1);  // attempt 0's slow stage 1 is over
  ASSERT_EQ(d.slower_than_planned.size(), 1u);
  EXPECT_NEAR(d.slower_than_planned.at(1), 2.0, 1e-3);
  const std::string text = DiagnosisText(t, d, {"a", "b"});
  EXPECT_NE(text.find("slower than planned: stage 1 (on b) computes 20.0 ms"), std::string::npos)
      << text;
}

TEST(Doctor, AnEmptyTraceSaysWhy) {
  v1::JobTrace t;
  t.set_job_id("job-1");
  EXPECT_NE(DiagnosisText(t, Diagnose(t, {}), {}).find("no spans"), std::string::npos);
}

}  // namespace
}  // namespace stagewise::cli
