#include "worker/stage_assignment.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "services/planner/plan_proto.h"
#include "services/spec/enums.h"
#include "services/spec/job_spec.h"

namespace stagewise::worker {

absl::Status CheckAssignment(const v1::StageAssignment& assignment, bool has_collective_store) {
  if (assignment.stage() < 0 || assignment.stage() >= assignment.num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("StageAssignment.stage: ", assignment.stage(),
                                                   " not in [0, ", assignment.num_stages(), ")"));
  }
  if (assignment.num_replicas() > 1 &&
      (assignment.replica() < 0 || assignment.replica() >= assignment.num_replicas())) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageAssignment.replica: ", assignment.replica(), " not in [0, ",
                     assignment.num_replicas(), ")"));
  }
  if (assignment.num_replicas() > 1 && !has_collective_store) {
    return absl::FailedPreconditionError(
        "StageAssignment.num_replicas: this worker has no collective store for replicated stages");
  }
  if (assignment.stage() + 1 < assignment.num_stages() && assignment.next_address().empty()) {
    return absl::InvalidArgumentError("StageAssignment.next_address: empty for a non-last stage");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<models::BlockMode>> BlockModesOf(const v1::StageAssignment& assignment) {
  const int num_blocks = assignment.block_end() - assignment.block_begin();
  if (assignment.block_modes_size() > 0 && assignment.block_modes_size() != num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageAssignment.block_modes: ", assignment.block_modes_size(),
                     " modes for the stage's ", num_blocks, " blocks"));
  }
  return planner::ModesFromProto(assignment.block_modes(), "StageAssignment.block_modes");
}

absl::StatusOr<std::optional<PipelineSchedule>> ScheduleOf(const v1::StageAssignment& assignment) {
  return planner::ScheduleFromProto(assignment.schedule(), "StageAssignment.schedule");
}

EncodeOptions WireOptions(const TransportSpec& transport, int64_t seed, bool to_next) {
  const WireFormatSpec& format = to_next ? transport.forward : transport.backward;
  EncodeOptions options;
  options.compression = planner::ToProto(format.compression);  // auto: none
  options.block_size = format.block;
  options.rotate = format.rotate;
  // Each job draws its own signs (the receiver reads the seed from the message).
  options.rotation_seed = kDefaultRotationSeed ^ static_cast<uint64_t>(seed);
  return options;
}

absl::StatusOr<ResolvedStage> ResolveStage(const v1::StageAssignment& assignment,
                                           const JobSpec& spec) {
  STAGEWISE_ASSIGN_OR_RETURN(const Compression forward,
                             planner::CompressionFromProto(assignment.forward_compression(),
                                                           "StageAssignment.forward_compression"));
  STAGEWISE_ASSIGN_OR_RETURN(const Compression backward,
                             planner::CompressionFromProto(assignment.backward_compression(),
                                                           "StageAssignment.backward_compression"));
  if (assignment.max_in_flight() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageAssignment.max_in_flight: ", assignment.max_in_flight(), " is negative"));
  }
  ResolvedStage out;
  TransportSpec transport = spec.transport;
  if (transport.forward.compression == Compression::kAuto) transport.forward.compression = forward;
  if (transport.backward.compression == Compression::kAuto) {
    transport.backward.compression = backward;
  }
  out.to_next = WireOptions(transport, spec.seed, /*to_next=*/true);
  out.to_prev = WireOptions(transport, spec.seed, /*to_next=*/false);
  out.in_flight = assignment.max_in_flight();
  STAGEWISE_ASSIGN_OR_RETURN(out.schedule, ScheduleOf(assignment));
  STAGEWISE_ASSIGN_OR_RETURN(out.block_modes, BlockModesOf(assignment));
  return out;
}

}  // namespace stagewise::worker
