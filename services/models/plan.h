// Torch-free model description: the blocks a job's model has (kinds, shapes,
// constructor arguments), per-block init seeds and stage partitions. The
// coordinator and the planner use this without linking LibTorch; zoo.cc
// builds the modules from the same descriptions.
#ifndef STAGEWISE_SERVICES_MODELS_PLAN_H_
#define STAGEWISE_SERVICES_MODELS_PLAN_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/common/job_spec.h"
#include "services/models/block_info.h"

namespace stagewise::models {

// Describes every block of the network `spec` names, without building it.
absl::StatusOr<std::vector<BlockInfo>> PlanModel(const ModelSpec& spec);

// Seed of global block `index` for a job seeded `job_seed` (splitmix64 mix).
uint64_t BlockSeed(uint64_t job_seed, int index);

// The [begin, end) block range of every stage: explicit ranges are checked
// against the model, "even" splits blocks as evenly as possible.
absl::StatusOr<std::vector<std::pair<int, int>>> ResolvePartition(const StagesSpec& stages,
                                                                  int num_blocks);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_PLAN_H_
