// The parts of a stage made from its assignment alone, before the runtime
// that runs them exists (StageRuntime::Create takes them): the job's spec as
// submitted with its paths confined to the operator's roots, what the plan
// chose for the stage, where it sits, its phases, its blocks on the device
// and, on stage 0, the data. Each error names the field or the key.
#ifndef STAGEWISE_WORKER_STAGE_BUILDER_H_
#define STAGEWISE_WORKER_STAGE_BUILDER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "services/data/dataset.h"
#include "services/models/memory_meter.h"
#include "services/models/model.h"
#include "services/spec/job_spec.h"
#include "stagewise/v1/coordinator.pb.h"
#include "worker/runtime_env.h"
#include "worker/stage_assignment.h"
#include "worker/stage_context.h"
#include "worker/stage_phases.h"

namespace stagewise::worker {

struct StageParts {
  JobSpec spec;
  ResolvedStage resolved;
  StagePlace place;
  std::unique_ptr<StagePhases> phases;
  std::shared_ptr<models::Model> model;  // on env.device, in training mode
  // Stage 0: the datasets and their samplers (null elsewhere).
  data::Datasets data;
  std::unique_ptr<data::BatchSampler> train, test;
};

// The model's parameters are charged to `memory` (the stage's account).
absl::StatusOr<StageParts> BuildStageParts(const v1::StageAssignment& assignment,
                                           const RuntimeEnv& env,
                                           const std::shared_ptr<models::MemoryAccount>& memory);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_BUILDER_H_
