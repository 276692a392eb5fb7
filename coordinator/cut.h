// How a job is cut into stages for an attempt: each stage's block range, its
// blocks' modes, backprop's schedule, the formats each stage sends with and
// how many mini-batches a decoupled stage keeps in flight. One value,
// resolved by the plan where the spec leaves something to it, held by the
// live job (LiveJob::cut), handed to the next attempt (Handover::Recut),
// produced by the plan (Scheduler::PlannedStages) and by a submission.
#ifndef STAGEWISE_COORDINATOR_CUT_H_
#define STAGEWISE_COORDINATOR_CUT_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "services/spec/enums.h"

namespace stagewise::coordinator {

struct Cut {
  // Stage j holds blocks [ranges[j].first, ranges[j].second).
  std::vector<std::pair<int, int>> ranges;
  // Per stage, per block; empty: every block's default (store).
  std::vector<std::vector<BlockMode>> modes;
  // backprop's `schedule: auto` as planned (StageAssignment.schedule); empty
  // when nothing was chosen.
  std::optional<PipelineSchedule> schedule;
  // transport's `compression: auto`: per stage, the formats the plan chose
  // (StageAssignment.forward_compression / backward_compression); empty
  // when nothing was chosen, or the cut changed without a plan.
  std::vector<WireChoice> wire;
  // delayed's `max_in_flight: auto`: per stage, the depth the plan chose to
  // cover the links' round trip (StageAssignment.max_in_flight); empty when
  // nothing was chosen (the stage keeps its natural depth).
  std::vector<int> max_in_flight;

  int num_stages() const { return static_cast<int>(ranges.size()); }
  // The same blocks cut along `ranges` instead: each block keeps its mode;
  // what the plan chose for the old stages (wire, depths) is dropped, the
  // schedule (one for the job) kept.
  Cut Recut(std::vector<std::pair<int, int>> new_ranges) const;
  // "[0,5) [5,10)".
  std::string Text() const;
  bool operator==(const Cut& o) const {
    return ranges == o.ranges && modes == o.modes && schedule == o.schedule && wire == o.wire &&
           max_in_flight == o.max_in_flight;
  }
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_CUT_H_
