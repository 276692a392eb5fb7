// The phases of a job as one stage trains them (multi-phase jobs,
// docs/job_spec.md#phases): which one runs, where its steps sit in the job,
// its base learning rate, and the coordinator's go-ahead for the next one.
// Owned by the stage runtime. The go-ahead (Release, Await, Cancel) is
// thread-safe; the current phase is the compute thread's (and construction's).
#ifndef STAGEWISE_WORKER_STAGE_PHASES_H_
#define STAGEWISE_WORKER_STAGE_PHASES_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/spec/job_spec.h"

namespace stagewise::worker {

class StagePhases {
 public:
  // `phases` as resolved for this stage (backprop's schedule: auto as the
  // plan chose); a mini-batch of `batch_size` samples (the learning rate's
  // scaling).
  StagePhases(std::vector<PhaseSpec> phases, int64_t steps_per_epoch, int64_t batch_size);
  StagePhases(const StagePhases&) = delete;
  StagePhases& operator=(const StagePhases&) = delete;

  // The go-ahead for `phase` (any thread). `strict` (the coordinator's
  // StartCommand): it must follow the last one released, else
  // FAILED_PRECONDITION naming StartCommand.phase; otherwise every phase up
  // to `phase` is released (a replacing stage's, whose job began them
  // already; a resumed stage's own).
  absl::Status Release(int phase, bool strict);
  bool Released(int phase) const;
  // Blocks until `phase` is released (OK) or Cancel (its status).
  absl::Status Await(int phase);
  // The stage stops: every Await returns `why` (the first one given).
  void Cancel(const absl::Status& why);

  // Compute thread: phase `p` becomes the current one (its steps follow the
  // phases before it); its spec.
  const PhaseSpec& Enter(int p);
  int count() const { return static_cast<int>(phases_.size()); }
  int current() const { return current_; }
  int64_t offset() const { return offset_; }      // the phases before it, in steps
  int64_t steps() const { return steps_; }        // the current phase's
  int64_t total_steps() const { return total_; }  // the whole job's
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  double base_lr() const { return base_lr_; }  // the current phase's peak rate

 private:
  const std::vector<PhaseSpec> phases_;
  const int64_t steps_per_epoch_;
  const int64_t batch_size_;
  int64_t total_ = 0;
  // The compute thread's.
  int current_ = 0;
  int64_t offset_ = 0;
  int64_t steps_ = 0;
  double base_lr_ = 0;

  mutable absl::Mutex mu_;
  int released_ ABSL_GUARDED_BY(mu_) = 0;  // the highest phase that may start
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_PHASES_H_
