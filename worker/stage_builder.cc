#include "worker/stage_builder.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/path_policy.h"
#include "services/common/status_macros.h"
#include "services/data/sizes.h"

namespace stagewise::worker {
namespace {

// Where the stage sits, from its assignment.
StagePlace PlaceOf(const v1::StageAssignment& assignment, const JobSpec& spec,
                   const RuntimeEnv& env, const ResolvedStage& resolved) {
  StagePlace place;
  place.job_id = assignment.job_id();
  place.stage = assignment.stage();
  place.num_stages = assignment.num_stages();
  place.replica = assignment.replica();
  place.num_replicas = std::max(1, assignment.num_replicas());
  place.batch_size = spec.batch_size / place.num_replicas;
  place.device = env.device;
  place.planned_in_flight = resolved.in_flight;
  return place;
}

// Stage 0's datasets and samplers.
absl::Status LoadData(const JobSpec& spec, int64_t steps_per_epoch, StageParts* parts) {
  STAGEWISE_ASSIGN_OR_RETURN(parts->data,
                             data::LoadDatasets(spec.data, static_cast<uint64_t>(spec.seed)));
  if (parts->data.train.size() / spec.batch_size != steps_per_epoch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path: expected ", data::NominalTrainSize(spec.data), " training samples for ",
        NameOf(spec.data.dataset), ", found ", parts->data.train.size()));
  }
  parts->train = std::make_unique<data::BatchSampler>(parts->data.train,
                                                      data::TrainSamplerOptions(spec, parts->data));
  parts->test = std::make_unique<data::BatchSampler>(parts->data.test,
                                                     data::TestSamplerOptions(spec, parts->data));
  return absl::OkStatus();
}

// The stage's blocks, their planned modes checked, on the device.
absl::StatusOr<std::shared_ptr<models::Model>> BuildBlocks(
    const v1::StageAssignment& assignment, const JobSpec& spec,
    const std::vector<models::BlockMode>& modes, torch::Device device) {
  STAGEWISE_ASSIGN_OR_RETURN(std::shared_ptr<models::Model> model,
                             models::BuildModel(spec.model, static_cast<uint64_t>(spec.seed),
                                                assignment.block_begin(), assignment.block_end()));
  for (int i = 0; i < static_cast<int>(modes.size()); ++i) {
    if (modes[i] == models::BlockMode::kRebuild && !model->blocks()[i]->reversible()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StageAssignment.block_modes[", i, "]: block ", model->blocks()[i]->info().index, " (",
          model->blocks()[i]->info().kind, ") is not reversible"));
    }
  }
  try {
    model->to(device);
    model->train();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("setting up stage ", assignment.stage(), ": ", e.what()));
  }
  return model;
}

}  // namespace

absl::StatusOr<StageParts> BuildStageParts(const v1::StageAssignment& assignment,
                                           const RuntimeEnv& env,
                                           const std::shared_ptr<models::MemoryAccount>& memory) {
  StageParts parts;
  STAGEWISE_ASSIGN_OR_RETURN(parts.spec, ParseJobSpec(assignment.job_spec_yaml()));
  JobSpec& spec = parts.spec;
  STAGEWISE_ASSIGN_OR_RETURN(parts.resolved, ResolveStage(assignment, spec));
  parts.place = PlaceOf(assignment, spec, env, parts.resolved);
  // The job spec is the submitter's: its paths stay inside the operator's roots.
  STAGEWISE_RETURN_IF_ERROR(ConfinePath("data.path", spec.data.path, env.data_roots).status());
  STAGEWISE_RETURN_IF_ERROR(
      ConfinePath("checkpoint.dir", spec.checkpoint.dir, env.checkpoint_roots).status());
  STAGEWISE_RETURN_IF_ERROR(ConfineModelFile(&spec.model, env.model_roots));
  STAGEWISE_RETURN_IF_ERROR(CheckAssignment(assignment, env.collective_store != nullptr));
  std::vector<PhaseSpec> phases = Phases(spec);  // backprop's schedule: auto as planned
  STAGEWISE_RETURN_IF_ERROR(ResolveAutoSchedule(parts.resolved.schedule, phases));
  STAGEWISE_ASSIGN_OR_RETURN(const int64_t steps_per_epoch, data::StepsPerEpoch(spec));
  parts.phases = std::make_unique<StagePhases>(std::move(phases), steps_per_epoch, spec.batch_size);
  if (assignment.stage() == 0) STAGEWISE_RETURN_IF_ERROR(LoadData(spec, steps_per_epoch, &parts));
  // Parameters count towards the stage's memory.
  models::ScopedMemoryAccount charge(memory);
  STAGEWISE_ASSIGN_OR_RETURN(parts.model,
                             BuildBlocks(assignment, spec, parts.resolved.block_modes, env.device));
  return parts;
}

}  // namespace stagewise::worker
