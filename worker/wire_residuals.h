// Error feedback for gradients sent in a lossy format
// (transport.error_feedback): what each micro-batch slot's last send lost,
// added to that slot's next send (EncodeOptions::residual), and saved with
// the stage's checkpoint so that a resumed run sends what an uninterrupted
// one would (on another cut, after resharding, they start afresh: the cut's
// tensors are others).
#ifndef STAGEWISE_WORKER_WIRE_RESIDUALS_H_
#define STAGEWISE_WORKER_WIRE_RESIDUALS_H_

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace stagewise::worker {

class WireResiduals {
 public:
  // Slot `micro_batch`'s residual (undefined before its first lossy send).
  // The pointer stays valid; one send at a time uses a slot.
  torch::Tensor* Slot(int micro_batch);
  // Every defined residual into `archive`; false when there is none.
  bool Save(torch::serialize::OutputArchive& archive);
  // Replaces the residuals with the saved ones, on `device`.
  absl::Status Load(torch::serialize::InputArchive& archive, torch::Device device);
  // The slots with a residual.
  int Count();

 private:
  absl::Mutex mu_;
  std::map<int, torch::Tensor> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_WIRE_RESIDUALS_H_
