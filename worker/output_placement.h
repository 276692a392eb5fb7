// Which of its same-host rings a CPU stage's compute thread makes its large
// tensors in (docs/performance.md, "Outputs made in the ring"). A tensor a
// stage sends to a neighbour on this host is copied into the ring it shares
// with it, on the way from one stage's compute to the next; made in that
// ring in the first place (host_blocks.h, placement), it is handed over as
// it is (SharedRing::Publish) and the copy is gone.
//
// The compute thread cannot know which of its allocations will be the
// output, so it places every allocation of the output's size (learned from
// the previous send that way) while it computes what goes to that side:
// after a message from stage j-1 it computes a forward (its output goes to
// j+1), after one from j+1 a backward (to j-1); stage 0 always aims at j+1,
// the last stage at j-1. A tensor placed that is not sent (an intermediate
// of the same size) is freed as any other; placing stops at half a ring in
// use, and a tensor that missed the ring is copied as before. An fp16 or
// bf16 send to a CPU neighbour is rounded into the ring by the compute
// thread before its compute span ends (Prepare; codec.h, NarrowIntoRing):
// a gradient where it was made (nothing reads it after its send), an output
// into a region of its own (its backward still reads it).
#ifndef STAGEWISE_WORKER_OUTPUT_PLACEMENT_H_
#define STAGEWISE_WORKER_OUTPUT_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "services/tensor/codec.h"
#include "services/tensor/host_blocks.h"
#include "worker/send_pipe.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

class OutputPlacement {
 public:
  // For the compute thread of stage j (`first`: j = 0, `last`: j = J-1);
  // `wire`: how tensors go to stage j+1 (true) or j-1 (StageContext::Wire).
  OutputPlacement(bool first, bool last, std::function<EncodeOptions(bool to_next)> wire)
      : first_(first), last_(last), wire_(std::move(wire)) {}
  ~OutputPlacement() = default;  // the thread places nothing any more
  OutputPlacement(const OutputPlacement&) = delete;
  OutputPlacement& operator=(const OutputPlacement&) = delete;

  // The compute thread took a message from `from`.
  void Received(Side from);
  // Before the compute span that made `tensor` ends (StageContext::PrepareSend):
  // an fp16/bf16 send to `to` is rounded into the ring now (NarrowIntoRing),
  // within the span, as a GPU narrows before its copy; the rounded tensor,
  // which Sending then passes as it is, or `tensor` itself.
  torch::Tensor Prepare(Side to, const torch::Tensor& tensor);
  // It is about to send `tensors` to `to`: narrows them into the ring where
  // NarrowIntoRing does, and learns the output's size.
  void Sending(Side to, std::vector<OutgoingTensor>* tensors);

 private:
  void Aim(bool to_next);
  // Whether a tensor sent with `wire` can be made in the ring: it goes as
  // it is, or it is a gradient rounded where it lies.
  static bool InPlace(const EncodeOptions& wire, bool to_next);

  const bool first_, last_;
  const std::function<EncodeOptions(bool)> wire_;
  uint64_t bytes_[2] = {0, 0};  // the last output's size to j-1, to j+1
  // Rounded by Prepare and not yet sent, to j-1 and to j+1 (held: their
  // memory cannot be another tensor's meanwhile).
  std::vector<torch::Tensor> prepared_[2];
  std::optional<ScopedHostPlacement> scope_;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_OUTPUT_PLACEMENT_H_
