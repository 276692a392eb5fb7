// Interleaved 1F1B (stages.chunks_per_worker = v > 1): a worker hosts v
// virtual stages of one pipeline, each a StageRuntime with its own compute
// thread. The schedule is an order of operations for the worker as a whole
// (services/planner/pipeline_schedule.h, Megatron's interleaved order), so
// the v threads take the device in turns: position p of a step's order is
// run by the chunk it names, and no other operation of the worker runs
// meanwhile. Everything outside the order (the optimizer step, evaluations,
// checkpoints) runs outside the turns.
//
// No LibTorch, no gRPC: the unit tests drive it with plain threads.
#ifndef STAGEWISE_WORKER_DEVICE_TURNS_H_
#define STAGEWISE_WORKER_DEVICE_TURNS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace stagewise::worker {

class DeviceTurns {
 public:
  // Blocks until position `pos` of the order of step `step` (of `size`
  // operations) is due, i.e. every earlier position of that step was
  // released, and the order of the step before ended. Position 0 starts a
  // step (steps need not be consecutive: phases count from 0 again). The
  // reason once Cancel was called (every waiter wakes); INVALID_ARGUMENT for
  // a position outside [0, size).
  absl::Status Acquire(int64_t step, int pos, int size);
  // The holder of position `pos` is done: the next one is due (after the
  // last one, position 0 of the next step). FAILED_PRECONDITION when `pos`
  // of `step` is not the position due (a caller out of order).
  absl::Status Release(int64_t step, int pos, int size);
  // Wakes every waiter with `why` (not OK), now and for good: a stage of
  // the worker stopped or failed, and the order can no longer complete.
  void Cancel(const absl::Status& why);

  // The position due and the step it belongs to (tests).
  int position() const;
  int64_t step() const;

 private:
  bool Due(int64_t step, int pos) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;  // the step position 0 last opened
  int pos_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_DEVICE_TURNS_H_
