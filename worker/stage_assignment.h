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
#include "services/tensor/codec.h"
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

// How a job's float32 tensors are encoded towards stage j+1 (`to_next`:
// activations, evaluations) or j-1 (gradients): transport.forward/backward
// (a direction still `auto`, which no plan resolved: none), each job drawing
// its own rotation signs from its seed.
EncodeOptions WireOptions(const TransportSpec& transport, int64_t seed, bool to_next);
inline EncodeOptions WireOptions(const JobSpec& spec, bool to_next) {
  return WireOptions(spec.transport, spec.seed, to_next);
}

// What the plan chose for this stage where the job says auto, read once from
// its assignment before the stage is built (the parsed spec stays as
// submitted): each side's encoding with transport's `compression: auto`
// resolved (the format StageAssignment.forward_compression /
// backward_compression carries, none when it carries none; fixed directions
// as the job says), and delayed's depth in flight for `max_in_flight: auto`.
struct ResolvedStage {
  EncodeOptions to_prev;  // gradients, towards stage j-1
  EncodeOptions to_next;  // activations and evaluations, towards stage j+1
  // StageAssignment.max_in_flight: the depth the plan chose (0: none).
  int in_flight = 0;
  // StageAssignment.schedule (ScheduleOf) and .block_modes (BlockModesOf).
  std::optional<PipelineSchedule> schedule;
  std::vector<models::BlockMode> block_modes;
  const EncodeOptions& wire(bool to_next_stage) const { return to_next_stage ? to_next : to_prev; }
};
// INVALID_ARGUMENT names the field for a value this version does not know.
absl::StatusOr<ResolvedStage> ResolveStage(const v1::StageAssignment& assignment,
                                           const JobSpec& spec);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_ASSIGNMENT_H_
