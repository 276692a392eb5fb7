// A stage's checkpoint shards (services/checkpoint/shard_archive.h): the
// stage's shard written at a cut, the shard a resume point names read back
// (or, on another cut, the shards holding the stage's blocks regrouped,
// worker/reshard.h), and a replacing replica started from a surviving
// replica's copy (worker/replica_copy.h fetches it). What the stage holds
// (model, optimizer, the replicas' outer state, the wire residuals) is
// reached through its StageContext; phases, events and metrics stay the
// stage runtime's, which owns one of these.
#ifndef STAGEWISE_WORKER_STAGE_SHARDS_H_
#define STAGEWISE_WORKER_STAGE_SHARDS_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/checkpoint/shard_archive.h"
#include "stagewise/v1/coordinator.pb.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

class StageShards {
 public:
  // Checks a shard's position against the job and enters its phase (which
  // may build the optimizer again), before anything is loaded into the
  // stage; DATA_LOSS naming `where` when it does not fit.
  using EnterPosition =
      std::function<absl::Status(const checkpoint::ShardPosition& at, const std::string& where)>;
  // Writes the running algorithm's state into a shard (Algorithm::SaveState).
  using SaveAlgorithm = std::function<absl::Status(torch::serialize::OutputArchive&)>;

  // What a load restored besides the stage's model, optimizer, random state,
  // outer synchronisation and wire residuals (which it loads in place).
  struct Restored {
    int64_t step = 0;        // global
    int64_t phase_step = 0;  // of the shard's phase
    // The messages the stage had sent and taken there; unknown after a
    // reshard (a replacement replays from them; a resumed attempt goes on
    // numbering).
    checkpoint::ShardPosition::Marks marks;
    bool resharded = false;  // regrouped from shards of another cut
    // Inside a phase on the same cut: the shard the algorithm's state was
    // read from, and that state (a nested archive may rely on its parent's
    // compilation unit, so the parent is declared first and destroyed last).
    // Null otherwise.
    std::unique_ptr<checkpoint::ShardReader> archive;
    std::unique_ptr<torch::serialize::InputArchive> algorithm;
  };

  // Where a shard went, for the coordinator (WorkerEvent.checkpoint_saved).
  struct Written {
    std::string path;
    int64_t bytes = 0;
    uint32_t crc32 = 0;
  };

  // `stage` and `assignment` outlive this object (the runtime owns all three).
  StageShards(StageContext& stage, const v1::StageAssignment& assignment, torch::Device device)
      : stage_(stage), assignment_(assignment), device_(device) {}

  // The stage's shard at `at` (with the algorithm's state when `algorithm`
  // is set), written atomically into the job's step directory under
  // checkpoint.dir; errors name checkpoint.dir.
  absl::StatusOr<Written> Write(const checkpoint::ShardPosition& at,
                                const SaveAlgorithm& algorithm);
  // StageAssignment.resume: the stage's own shard, or on another cut
  // (ResumePoint.sources) every shard holding its blocks; each read,
  // verified and checked against the resume point (DATA_LOSS otherwise). A
  // replacing stage needs message counts: UNAVAILABLE without them.
  absl::StatusOr<Restored> Load(const v1::ResumePoint& resume, const EnterPosition& enter);
  // A replacing replica: the state a surviving replica published, `where`
  // naming it in errors.
  absl::StatusOr<Restored> LoadCopy(std::unique_ptr<checkpoint::ShardReader> copy,
                                    const std::string& where, const EnterPosition& enter);

 private:
  // One shard named by the resume point, read, verified and checked against
  // it (step, phase, blocks): DATA_LOSS otherwise.
  absl::StatusOr<std::unique_ptr<checkpoint::ShardReader>> ReadChecked(
      const std::string& path, int64_t bytes, uint32_t crc32, const v1::ResumePoint& resume,
      int block_begin, int block_end) const;

  StageContext& stage_;
  const v1::StageAssignment& assignment_;
  const torch::Device device_;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_SHARDS_H_
