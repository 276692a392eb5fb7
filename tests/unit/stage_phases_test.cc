// A stage's phases (worker/stage_phases.h) and where it resumes
// (worker/stage_resume.h), without a runtime: the go-ahead for the next phase
// in the order the coordinator gives it, a wait that a stop ends, each
// phase's step window, and what a restored shard leaves for the compute
// thread.
#include "worker/stage_phases.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "worker/stage_resume.h"

namespace stagewise::worker {
namespace {

std::vector<PhaseSpec> ThreePhases() {
  std::vector<PhaseSpec> phases(3);
  phases[0].steps = 10;
  phases[1].steps = 5;
  phases[2].steps = 20;
  for (PhaseSpec& p : phases) p.optimizer.lr = 0.1;
  return phases;
}

TEST(StagePhases, EachPhaseStartsWhereTheOneBeforeEnded) {
  StagePhases phases(ThreePhases(), /*steps_per_epoch=*/4, /*batch_size=*/16);
  EXPECT_EQ(phases.count(), 3);
  EXPECT_EQ(phases.total_steps(), 35);
  phases.Enter(0);
  EXPECT_EQ(phases.offset(), 0);
  EXPECT_EQ(phases.steps(), 10);
  phases.Enter(2);  // a resume may skip ahead
  EXPECT_EQ(phases.current(), 2);
  EXPECT_EQ(phases.offset(), 15);
  EXPECT_EQ(phases.steps(), 20);
  EXPECT_GT(phases.base_lr(), 0);
}

TEST(StagePhases, TheCoordinatorsGoAheadComesInOrder) {
  StagePhases phases(ThreePhases(), 4, 16);
  EXPECT_TRUE(phases.Released(0));
  EXPECT_FALSE(phases.Released(1));
  const absl::Status skipped = phases.Release(2, /*strict=*/true);
  EXPECT_EQ(skipped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(skipped.message(), "StartCommand.phase: 2 does not follow phase 0"))
      << skipped;
  EXPECT_TRUE(phases.Release(1, true).ok());
  EXPECT_TRUE(phases.Released(1));
  EXPECT_FALSE(phases.Release(1, true).ok());  // once
  EXPECT_FALSE(phases.Release(3, true).ok());  // no such phase
  // A replacing stage's: every phase up to it, never beyond the last, never back.
  EXPECT_TRUE(phases.Release(7, /*strict=*/false).ok());
  EXPECT_TRUE(phases.Released(2));
  EXPECT_TRUE(phases.Release(0, false).ok());
  EXPECT_TRUE(phases.Released(2));
  EXPECT_TRUE(phases.Await(2).ok());
}

TEST(StagePhases, AWaitEndsWithTheGoAheadOrWithTheStop) {
  StagePhases phases(ThreePhases(), 4, 16);
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(phases.Release(1, true).ok());
  });
  EXPECT_TRUE(phases.Await(1).ok());
  release.join();
  std::thread stop([&] {
    absl::SleepFor(absl::Milliseconds(20));
    phases.Cancel(absl::UnavailableError("neighbour lost"));
    phases.Cancel(absl::CancelledError("later"));  // the first one stays
  });
  const absl::Status waited = phases.Await(2);
  stop.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(phases.Await(2).message(), "neighbour lost");
}

TEST(StageResume, TakesARestoredShardAndStartsLaterPhasesFresh) {
  StageResume resume;
  EXPECT_EQ(resume.start_phase(), 0);
  EXPECT_EQ(resume.state(), nullptr);
  StageShards::Restored restored;
  restored.step = 12;
  restored.phase_step = 2;
  restored.resharded = true;
  restored.marks.taken_prev = 7;
  restored.algorithm = std::make_unique<torch::serialize::InputArchive>();
  resume.Take(std::move(restored), /*phase=*/1, /*total_steps=*/35);
  EXPECT_EQ(resume.start_phase(), 1);
  EXPECT_EQ(resume.first_step(), 2);
  EXPECT_TRUE(resume.resharded());
  EXPECT_FALSE(resume.at_end());
  EXPECT_EQ(resume.step(), 12);
  EXPECT_EQ(resume.marks().taken_prev, 7);
  EXPECT_NE(resume.state(), nullptr);
  resume.NextPhase();
  EXPECT_EQ(resume.first_step(), 0);
  EXPECT_FALSE(resume.resharded());
  EXPECT_EQ(resume.state(), nullptr);
  EXPECT_EQ(resume.start_phase(), 1);

  // At a phase's start another cut misses no state; at the last step there
  // is nothing left to train.
  StageResume end;
  StageShards::Restored last;
  last.step = 35;
  last.phase_step = 0;
  last.resharded = true;
  end.Take(std::move(last), 2, 35);
  EXPECT_FALSE(end.resharded());
  EXPECT_TRUE(end.at_end());
}

}  // namespace
}  // namespace stagewise::worker
