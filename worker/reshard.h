// Resharding: a stage whose block range is not one of its checkpoint's
// (a job resumed on fewer stages, or on another cut) takes its parameters,
// buffers and optimizer state from the shards that hold its blocks.
//
// Blocks are named by their global index in every stage model
// (services/models/model.h), so a tensor's name is the same whatever stage
// holds it. Each source shard's stage model is rebuilt for the source's block
// range, its "model" and "optimizer" archives are loaded into it and an
// optimizer of the same kind, and what the target stage holds is copied over
// by name: parameter and buffer values, and each parameter's optimizer state
// (momentum, Adam's moments and step count). The algorithm's own state is not
// regrouped (StageContext::resharded, docs/fault_tolerance.md).
#ifndef STAGEWISE_WORKER_RESHARD_H_
#define STAGEWISE_WORKER_RESHARD_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/checkpoint/shard_archive.h"
#include "services/models/model.h"

namespace stagewise::worker {

// One shard of the checkpoint, read already.
struct ReshardSource {
  std::string path;  // names it in errors
  int block_begin = 0;
  int block_end = 0;
  checkpoint::ShardReader* shard = nullptr;  // the whole shard
};

// Builds the stage model of the blocks [begin, end) (the job's model spec and
// seed, on the target's device).
using BuildStageModel =
    std::function<absl::StatusOr<std::shared_ptr<models::Model>>(int begin, int end)>;
// An optimizer over `model` of the kind that saved the shards.
using BuildOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(models::Model&)>;

// Fills `model` and `optimizer` (built over `model`) from `sources`. Every
// parameter and buffer of `model` must come from exactly one source, with the
// same shape: DATA_LOSS naming the tensor and the shard otherwise.
// Optimizer state is carried for every parameter that had some.
absl::Status RegroupShards(const std::vector<ReshardSource>& sources, models::Model& model,
                           torch::optim::Optimizer& optimizer, const BuildStageModel& build_model,
                           const BuildOptimizer& build_optimizer);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_RESHARD_H_
