// The checks of a StageAssignment a worker makes before it builds a stage
// (each error names the field).
#ifndef STAGEWISE_WORKER_STAGE_ASSIGNMENT_H_
#define STAGEWISE_WORKER_STAGE_ASSIGNMENT_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/models/modal_pass.h"
#include "services/spec/enums.h"
#include "services/spec/job_spec.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::worker {

// The stage and replica in range, a collective store for replicated stages
// (`has_collective_store`), a next address for every stage but the last.
absl::Status CheckAssignment(const v1::StageAssignment& assignment, bool has_collective_store);

// StageAssignment.block_modes as modes: none, or one known mode per block.
absl::StatusOr<std::vector<models::BlockMode>> BlockModesOf(const v1::StageAssignment& assignment);

// StageAssignment.schedule: the schedule the planner chose for `schedule:
// auto`, or none; INVALID_ARGUMENT for a value this version does not know.
absl::StatusOr<std::optional<PipelineSchedule>> ScheduleOf(const v1::StageAssignment& assignment);

// transport's `compression: auto`, resolved: each direction the job leaves
// to the planner takes the format StageAssignment.forward_compression /
// backward_compression carries (none when it carries none); fixed directions
// stay. INVALID_ARGUMENT names the field for a value this version does not
// know.
absl::Status ResolveAutoWire(const v1::StageAssignment& assignment, TransportSpec* transport);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_ASSIGNMENT_H_
