#include "worker/stage_resume.h"

#include <utility>

namespace stagewise::worker {

void StageResume::Take(StageShards::Restored restored, int phase, int64_t total_steps) {
  start_phase_ = phase;
  first_step_ = restored.phase_step;
  // Regrouped from another cut's shards inside a phase (at a phase's start
  // there is no algorithm state to miss).
  resharded_ = restored.resharded && restored.phase_step > 0;
  at_end_ = restored.step == total_steps;
  step_ = restored.step;
  marks_ = restored.marks;
  archive_ = std::move(restored.archive);
  state_ = std::move(restored.algorithm);
}

void StageResume::NextPhase() {
  first_step_ = 0;
  resharded_ = false;
  state_.reset();
  archive_.reset();
}

}  // namespace stagewise::worker
