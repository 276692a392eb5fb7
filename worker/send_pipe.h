// A stage's sends to one neighbour, encoded off the compute thread
// (docs/performance.md, "Sends overlap compute"). The compute thread queues a
// message with the tensors still to encode into it and goes on computing; the
// pipe's own thread encodes them (narrowing to fp16/bf16, the copy into the
// shared ring or into the message) and hands the message on, in queue order.
// Its thread asks for a short scheduler slice (services/common/thread_slice.h).
// Bounded: Push blocks while `capacity` sends wait. The first failure is
// sticky: later pushes and drains return it, and `on_error` hears it once
// (the stage then fails, which wakes a compute thread blocked on a receive).
//
// The compute thread must not modify a queued tensor in place; the queue
// holds a reference, so it stays alive until it is encoded.
#ifndef STAGEWISE_WORKER_SEND_PIPE_H_
#define STAGEWISE_WORKER_SEND_PIPE_H_

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/tensor/codec.h"
#include "stagewise/v1/stage.pb.h"

namespace stagewise::worker {

// A tensor a send encodes into its message as `name` (EncodeTensor with `wire`).
struct OutgoingTensor {
  std::string name;
  torch::Tensor tensor;
  EncodeOptions wire;
};

// Encodes each of `tensors` into `message` on the calling thread; an error
// names the tensor.
absl::Status EncodeInto(v1::StageMessage* message, const std::vector<OutgoingTensor>& tensors);

class SendPipe {
 public:
  // Hands one encoded message on (blocks while the stream's outbox is full).
  // `step` is what Push was given with it.
  using Deliver = std::function<absl::Status(v1::StageMessage message, int64_t step)>;
  // A stage's capacity: sends queued beyond the one being encoded (each
  // holds its tensors until then), enough to overlap the next micro-batch.
  static constexpr size_t kStageCapacity = 2;
  SendPipe(size_t capacity, Deliver deliver, std::function<void(const absl::Status&)> on_error);
  // Close, then waits for the thread (a send being handed on finishes).
  ~SendPipe();
  SendPipe(const SendPipe&) = delete;
  SendPipe& operator=(const SendPipe&) = delete;

  // Queues `message` with `tensors` to encode into it. The first error of an
  // earlier send, or Close's reason, instead.
  absl::Status Push(v1::StageMessage message, std::vector<OutgoingTensor> tensors, int64_t step);
  // Blocks until every queued send was handed on: OK, or the first error.
  absl::Status Drain();
  // Drops what waits; later pushes and drains fail with `why` (not OK), unless
  // a send had failed before.
  void Close(const absl::Status& why);
  // Messages queued or being encoded and handed on.
  int64_t pending() const;

 private:
  struct Item {
    v1::StageMessage message;
    std::vector<OutgoingTensor> tensors;
    int64_t step = 0;
  };
  void Loop();

  const size_t capacity_;
  const Deliver deliver_;
  const std::function<void(const absl::Status&)> on_error_;
  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the thread holds an item
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // started by the first Push
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_SEND_PIPE_H_
