// The planner's values on the wire and in checkpoint manifests
// (proto/stagewise/v1/plan.proto): the one place that converts between the
// spec's enums (services/spec/enums.h) and their proto mirrors. Nothing
// travels as its YAML spelling.
#ifndef STAGEWISE_SERVICES_PLANNER_PLAN_PROTO_H_
#define STAGEWISE_SERVICES_PLANNER_PLAN_PROTO_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/planner/profile.h"
#include "services/spec/enums.h"
#include "stagewise/v1/plan.pb.h"
#include "stagewise/v1/tensor.pb.h"

namespace stagewise::planner {

// A chosen schedule, or UNSPECIFIED for none.
v1::PipelineSchedule ToProto(std::optional<PipelineSchedule> schedule);
// UNSPECIFIED is none; INVALID_ARGUMENT names `field` for a value this
// version does not know.
absl::StatusOr<std::optional<PipelineSchedule>> ScheduleFromProto(v1::PipelineSchedule schedule,
                                                                  const std::string& field);

v1::BlockMode ToProto(BlockMode mode);
// Every mode must be STORE or REBUILD; INVALID_ARGUMENT names `field[i]`.
absl::StatusOr<std::vector<BlockMode>> ModesFromProto(
    const google::protobuf::RepeatedField<int>& modes, const std::string& field);

// A wire format as tensor.proto's Compression; kAuto (not a format) is NONE.
v1::Compression ToProto(Compression compression);
// NONE, FP16, BF16, INT8 or INT4; INVALID_ARGUMENT names `field` otherwise.
absl::StatusOr<Compression> CompressionFromProto(v1::Compression compression,
                                                 const std::string& field);

// A profile and its proto. FromProto checks what the planner relies on:
// blocks 0..n-1 in order, a batch size >= 1, no negative or non-finite time
// and no negative size; INVALID_ARGUMENT naming the field otherwise.
v1::ModelProfile ToProto(const ModelProfile& profile);
absl::StatusOr<ModelProfile> ProfileFromProto(const v1::ModelProfile& proto);

}  // namespace stagewise::planner

#endif  // STAGEWISE_SERVICES_PLANNER_PLAN_PROTO_H_
