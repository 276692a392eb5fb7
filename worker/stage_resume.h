// Where a stage starts when it does not start at the job's beginning: a
// checkpoint shard (StageAssignment.resume) or a surviving replica's copy, as
// StageShards restored it (its phase entered already). Owned by the stage
// runtime beside its StageShards; set while the stage is built, then the
// compute thread's.
#ifndef STAGEWISE_WORKER_STAGE_RESUME_H_
#define STAGEWISE_WORKER_STAGE_RESUME_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "services/checkpoint/shard_archive.h"
#include "worker/stage_shards.h"

namespace stagewise::worker {

class StageResume {
 public:
  // `restored` at phase `phase` of a job of `total_steps` steps.
  void Take(StageShards::Restored restored, int phase, int64_t total_steps);
  // A later phase starts at its step 0, on this cut, with no saved state.
  void NextPhase();

  int start_phase() const { return start_phase_; }    // the phase the compute thread begins with
  int64_t first_step() const { return first_step_; }  // of the current phase
  // Resumed inside a phase on another cut: no algorithm state.
  bool resharded() const { return resharded_; }
  // Resumed from the checkpoint at the job's last step: nothing to train.
  bool at_end() const { return at_end_; }
  int64_t step() const { return step_; }  // the job's step it resumed at (0: none)
  // The messages sent and taken at the resume (unknown: none, or resharded).
  const checkpoint::ShardPosition::Marks& marks() const { return marks_; }
  // The algorithm's saved state (null: none).
  torch::serialize::InputArchive* state() const { return state_.get(); }

 private:
  int start_phase_ = 0;
  int64_t first_step_ = 0;
  bool resharded_ = false;
  bool at_end_ = false;
  int64_t step_ = 0;
  checkpoint::ShardPosition::Marks marks_;
  // The shard state_ was read from: a nested archive may rely on its
  // parent's compilation unit, so the parent is declared first (destroyed
  // last).
  std::unique_ptr<checkpoint::ShardReader> archive_;
  std::unique_ptr<torch::serialize::InputArchive> state_;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_RESUME_H_
