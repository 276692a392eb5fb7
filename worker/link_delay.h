// Emulated link latency (benchmarks and tests; netem is not on every
// machine): each data message a stage receives from one neighbour reaches
// its inbox `delay` after it arrived, in the order it arrived. Holding is
// pipelined, as on a long link: a message that arrives while others are held
// waits only its own delay, so a link's bandwidth is unchanged and a
// sequence of n back-to-back messages costs one delay, not n. At most
// `max_messages` messages or `max_bytes` of them are held (the emulated
// link's window: its bandwidth is at most max_bytes per delay); then the
// stream stops reading until one leaves (flow control, as the inbox's own),
// and a full inbox holds the line up in turn.
//
// One line per side of a stage (worker/stage_streams.h). Handshakes (RING,
// RESUME) are not held: the delay is on the data path only.
//
// Threading: Hold from a stream's reaction (never blocks); the line's own
// thread hands messages on (`pass` may block); Close anywhere; the
// destructor joins the thread.
#ifndef STAGEWISE_WORKER_LINK_DELAY_H_
#define STAGEWISE_WORKER_LINK_DELAY_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagewise/v1/stage.pb.h"

namespace stagewise::worker {

class LinkDelay {
 public:
  // `pass` hands a message on once its delay is over; it may block (a full
  // inbox) and returns false when the receiver is gone (the line closes and
  // drops what it holds).
  LinkDelay(absl::Duration delay, size_t max_messages, int64_t max_bytes,
            std::function<bool(v1::StageMessage)> pass);
  ~LinkDelay();
  LinkDelay(const LinkDelay&) = delete;
  LinkDelay& operator=(const LinkDelay&) = delete;

  // Holds `message` until now + delay. Never blocks: true while there is room
  // for more; false when the line is full, and then `resume` runs once,
  // after a message has left. CANCELLED once the line is closed.
  absl::StatusOr<bool> Hold(v1::StageMessage message, std::function<void()> resume);

  // Drops what is held and stops the thread; Hold fails from now on.
  void Close();

  absl::Duration delay() const { return delay_; }
  size_t held() const;

 private:
  struct Held {
    absl::Time due;
    int64_t bytes = 0;
    v1::StageMessage message;
  };
  void Run();
  bool HasHeldOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !held_.empty();
  }

  const absl::Duration delay_;
  const size_t max_messages_;
  const int64_t max_bytes_;
  const std::function<bool(v1::StageMessage)> pass_;
  mutable absl::Mutex mu_;
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The stream's resume while the line is full.
  std::function<void()> resume_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_LINK_DELAY_H_
