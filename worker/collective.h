// Averaging among the R replicas of one stage (docs/replicas.md): LibTorch's
// own c10d ProcessGroupGloo over a c10d Store, with gradients packed into
// buckets, and a timeout that turns a stuck collective into a stage error
// instead of a hang. ProcessGroupGloo's header (and gloo's, which it needs)
// stays inside collective.cc: a LibTorch without gloo's headers (PyTorch's
// pip wheels) builds everything else, and there R > 1 is refused.
#ifndef STAGEWISE_WORKER_COLLECTIVE_H_
#define STAGEWISE_WORKER_COLLECTIVE_H_

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagewise::worker {

struct ReplicaGroupOptions {
  int rank = 0;  // this replica, 0..size-1
  int size = 1;  // R
  // The address gloo binds its connections to (the worker's advertised host);
  // peers connect to it directly, outside gRPC.
  std::string host = "127.0.0.1";
  // Any rendezvous or collective that takes longer fails with
  // DEADLINE_EXCEEDED (a peer is gone or stuck) and leaves the group broken.
  absl::Duration timeout = absl::Seconds(300);
  // Gradients travel in flat buckets of at most this many bytes (one tensor
  // larger than that gets a bucket of its own).
  int64_t bucket_bytes = int64_t{25} << 20;
  // What errors call the group, e.g. "stage 1".
  std::string name = "replica group";
  // A failed average leaves the tensors passed in as they were, so that it
  // can be run again in another group (recovery.replay's replica
  // replacement): every bucket is a copy, even of one tensor, and nothing is
  // written back before every bucket's sum arrived.
  bool keep_inputs = false;
};

// How tensors go into buckets: runs of consecutive tensors of one dtype and
// device, at most `limit` bytes together (a larger tensor alone); indices
// into `tensors`, in order. Every replica that passes the same shapes gets
// the same layout.
std::vector<std::vector<int>> BucketLayout(const std::vector<torch::Tensor>& tensors,
                                           int64_t limit);

class ReplicaGroup {
 public:
  // False where this build's LibTorch came without gloo's headers: then
  // Create refuses a group of more than one replica.
  static bool GlooAvailable();

  // Meets the other size-1 replicas through `store` (every replica of the
  // group passes a store with the same keys, e.g. a PrefixStore per group and
  // attempt) and connects to each of them. Blocks up to options.timeout.
  static absl::StatusOr<std::unique_ptr<ReplicaGroup>> Create(c10::intrusive_ptr<c10d::Store> store,
                                                              const ReplicaGroupOptions& options);

  // Every replica ends with the mean over the group of each parameter's
  // gradient (an undefined gradient counts as zeros and becomes defined).
  // Every replica must call it with the same parameters in the same order.
  absl::Status AverageGradients(const std::vector<torch::Tensor>& params);
  // The same for plain tensors, averaged in place (parameters, statistics).
  absl::Status Average(const std::vector<torch::Tensor>& tensors);
  // Replica 0's values copied into every replica's tensors, in place.
  absl::Status Broadcast(const std::vector<torch::Tensor>& tensors);

  // One bucket's all-reduce in flight (OverlappedAverage starts buckets one
  // by one while a backward runs).
  struct Pending {
    std::vector<torch::Tensor> members;
    torch::Tensor flat;  // the members flattened (or the one member itself)
    c10::intrusive_ptr<c10d::Work> work;
  };
  // Starts summing `members` (one bucket: same dtype and device) over the
  // group. Every replica must start the same buckets in the same order.
  absl::StatusOr<Pending> StartSum(std::vector<torch::Tensor> members);
  // Waits for every started sum, multiplies it by `scale` and copies it back
  // into its members; `start` is when the first was started (for errors and
  // seconds()).
  absl::Status FinishSums(std::vector<Pending>& pending, double scale, absl::Time start);
  int64_t bucket_bytes() const { return options_.bucket_bytes; }

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  // Bytes this replica contributed to all-reduces and broadcasts, and the
  // seconds it spent in them (waiting included).
  int64_t bytes() const { return bytes_.load(); }
  double seconds() const { return seconds_.load(); }

  ~ReplicaGroup();
  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

 private:
  struct Gloo;  // the c10d process group (collective.cc)
  ReplicaGroup(std::unique_ptr<Gloo> gloo, ReplicaGroupOptions options);
  // All-reduces (sum) the tensors bucket by bucket, then divides by size.
  absl::Status SumThenScale(const std::vector<torch::Tensor>& tensors, double scale);
  absl::Status Failed(const std::string& what, const std::exception& e, absl::Time start);

  std::unique_ptr<Gloo> gloo_;
  ReplicaGroupOptions options_;
  bool broken_ = false;
  std::string broken_reason_;
  std::atomic<int64_t> bytes_{0};
  std::atomic<double> seconds_{0};
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_COLLECTIVE_H_
