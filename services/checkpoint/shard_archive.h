// One stage's shard of a checkpoint as a LibTorch archive: the one format
// that the stage runtime writes and resumes from, that train-local's
// reference trainer writes and reads (so `stagewise export` reads both
// alike), that resharding regroups and that the algorithms' fake context
// round-trips in its tests. The files around it (layout, manifests, atomic
// writes, checksums) are services/checkpoint/checkpoint.h.
//
// Entries: "model" and "optimizer" (their own save()), "algorithm" (the
// algorithm's state; empty when it keeps none), "step", "phase",
// "phase_step", "stage", "block_begin", "block_end" (int64 scalars), and
// optionally "rng" (the default CPU generator's state) and "outer_sync"
// (replicas' outer synchronisation), "wire_residuals" (error feedback),
// "stream_marks" (the stage's message counts, int64 [4]).
#ifndef STAGEWISE_SERVICES_CHECKPOINT_SHARD_ARCHIVE_H_
#define STAGEWISE_SERVICES_CHECKPOINT_SHARD_ARCHIVE_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stagewise::checkpoint {

// Where in the job a shard was taken, and which blocks it holds.
struct ShardPosition {
  int64_t step = 0;        // global steps done
  int64_t phase = 0;       // the phase it was taken in
  int64_t phase_step = 0;  // steps of that phase done
  int64_t stage = 0;
  int64_t block_begin = 0;
  int64_t block_end = 0;
  // The stage's data messages on its neighbour streams when it was taken
  // (StageMessage.seq): sent to stage j+1 and to j-1, taken from j-1 and
  // from j+1. -1: not recorded (shards from before them).
  struct Marks {
    int64_t sent_next = -1;
    int64_t sent_prev = -1;
    int64_t taken_prev = -1;
    int64_t taken_next = -1;
    bool known() const { return sent_next >= 0; }
  };
  Marks marks;
};

// What goes into a shard besides the model and its optimizer.
struct ShardExtras {
  // Writes the algorithm's state (null: it keeps none, an empty entry).
  std::function<absl::Status(torch::serialize::OutputArchive&)> algorithm;
  // Writes the replicas' outer synchronisation; returns false when there is
  // none to save (null: none).
  std::function<bool(torch::serialize::OutputArchive&)> outer_sync;
  // Writes the error feedback of the stage's gradient sends; returns false
  // when there is none (null: none).
  std::function<bool(torch::serialize::OutputArchive&)> wire_residuals;
  bool rng = false;  // the default CPU generator's state
  // With `rng`: this state instead of the generator's now (a state taken
  // earlier, e.g. at the start of the step a replica copy is of).
  torch::Tensor rng_state;
};

// The shard's bytes. INTERNAL with the cause when LibTorch fails to save.
absl::StatusOr<std::string> SerializeShard(const ShardPosition& position, torch::nn::Module& model,
                                           torch::optim::Optimizer& optimizer,
                                           const ShardExtras& extras = {});

class ShardReader {
 public:
  // Parses `bytes` (tensors placed on `device`); DATA_LOSS naming `what`
  // (the file) when they are not a shard.
  static absl::StatusOr<std::unique_ptr<ShardReader>> Parse(const std::string& bytes,
                                                            const torch::Device& device,
                                                            const std::string& what);

  const ShardPosition& position() const { return position_; }
  // The model's and the optimizer's state into `model` / `optimizer`
  // (DATA_LOSS naming the file when they do not fit).
  absl::Status LoadModel(torch::nn::Module& model);
  absl::Status LoadOptimizer(torch::optim::Optimizer& optimizer);
  // The algorithm's state. The returned archive may rely on this reader:
  // keep the reader alive as long.
  std::unique_ptr<torch::serialize::InputArchive> Algorithm();
  // The outer synchronisation's entry into `out`; false when there is none.
  bool OuterSync(torch::serialize::InputArchive& out);
  // The error feedback's entry into `out`; false when there is none.
  bool WireResiduals(torch::serialize::InputArchive& out);
  // Sets the default CPU generator to the saved state; false when none.
  bool RestoreRng();

 private:
  ShardReader() = default;
  torch::serialize::InputArchive archive_;
  ShardPosition position_;
  std::string what_;
};

// The shard file at `path`, checked against its manifest entry (size and
// CRC-32) and parsed; DATA_LOSS naming the file otherwise (that checkpoint
// is unusable, an older one may not be).
absl::StatusOr<std::unique_ptr<ShardReader>> ReadShardFile(const std::string& path, int64_t bytes,
                                                           uint32_t crc32,
                                                           const torch::Device& device);

}  // namespace stagewise::checkpoint

#endif  // STAGEWISE_SERVICES_CHECKPOINT_SHARD_ARCHIVE_H_
