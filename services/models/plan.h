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
#include "services/models/block_info.h"
#include "services/spec/job_spec.h"

namespace stagewise::models {

// Describes every block of the network `spec` names, without building it.
absl::StatusOr<std::vector<BlockInfo>> PlanModel(const ModelSpec& spec);

// bottleneck_down or bottleneck_up: the projections stages.bottleneck puts
// at the cuts.
bool IsBottleneckBlock(const BlockInfo& b);

// Seed of global block `index` for a job seeded `job_seed` (splitmix64 mix).
uint64_t BlockSeed(uint64_t job_seed, int index);

// Trainable parameters of block `b` (exact for the zoo's blocks; the dry
// run's count for script blocks): validate's and plan's per-stage figures.
double EstimateParameters(const BlockInfo& b);

// Relative forward + backward work of one sample through block `b`, in
// multiply-accumulate equivalents: the MACs of its convolutions and linear
// layers, plus a charge per value for the memory-bound work around them
// (batch norm, ReLU, additions, copies). Calibrated against a one-thread CPU
// profile of the quickstart RevNet (docs/planner.md, "Balanced partitions").
// An estimate for the default partition, not a measurement: `partition: auto`
// profiles the blocks on a worker instead. Emulated blocks convert their
// configured times at the same calibration, so a mixed model stays consistent.
double EstimateBlockWork(const BlockInfo& b);

// The [begin, end) block range of every stage. Explicit ranges are checked
// against the model; "even" splits the block count as evenly as possible;
// "balanced" (the default) and "auto" cut where the estimated work of the
// slowest stage is smallest (for "auto" that is a placeholder until the
// coordinator plans from a profile). A model with stages.bottleneck's
// projections is cut between each bottleneck_down and its bottleneck_up
// when the stage count is the job's (explicit ranges then name the model
// without them); any other count cuts it as above.
absl::StatusOr<std::vector<std::pair<int, int>>> ResolvePartition(
    const StagesSpec& stages, const std::vector<BlockInfo>& blocks);

}  // namespace stagewise::models

#endif  // STAGEWISE_SERVICES_MODELS_PLAN_H_
