// The coordinator's loop thread: tasks from a bounded FIFO queue, run one at
// a time, and between them what its owner asks for (hooks): heartbeat
// expiry, scheduling passes, batched progress writes. The queue is the only
// way other threads act on the owner's state (JobManager's live jobs).
//
// Threading: Post and RunOnLoop from any thread. Post blocks while the queue
// is full unless called on the loop (which is the one making room); it
// fails once Stop has begun or before Start. Stop runs every task queued
// before it, calls on_stop and joins. Hooks run on the loop thread.
#ifndef STAGEWISE_COORDINATOR_TASK_LOOP_H_
#define STAGEWISE_COORDINATOR_TASK_LOOP_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/check.h"

namespace stagewise::coordinator {

class TaskLoop {
 public:
  using Task = std::function<void()>;
  struct Hooks {
    // When the loop must wake up although no task arrived (asked before
    // each wait).
    std::function<absl::Time()> next_deadline;
    // After each task.
    std::function<void()> after_task;
    // After each batch of tasks, or a wake-up with none.
    std::function<void()> housekeeping;
    // Then, with whether the queue is empty now (the loop ends when it is
    // and Stop has begun).
    std::function<void(bool idle)> end_of_batch;
    // Once, after the last task.
    std::function<void()> on_stop;
  };

  TaskLoop(size_t max_queued, Hooks hooks) : max_queued_(max_queued), hooks_(std::move(hooks)) {}
  ~TaskLoop() { Stop(); }
  TaskLoop(const TaskLoop&) = delete;
  TaskLoop& operator=(const TaskLoop&) = delete;

  // The caller owns the loop's state until Start (OnLoop is true for it).
  void BindCaller() { thread_.Bind(); }
  // Starts the thread; FAILED_PRECONDITION when started or stopped before.
  absl::Status Start();
  // Runs the tasks already queued, then on_stop, and joins. Idempotent.
  void Stop();
  // Queues `task`; false (and the task dropped) once Stop has begun or
  // before Start.
  bool Post(Task task) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `task` on the loop (at once when called there) and waits for it;
  // false if the loop is gone.
  bool RunOnLoop(Task task) ABSL_LOCKS_EXCLUDED(mu_);
  // Started and not stopping: a task posted now will run.
  bool accepting() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return running_ && !stopping_;
  }
  // On the loop thread (or the Start caller before the loop runs).
  bool OnLoop() const { return thread_.OnOwner(); }

 private:
  void Run();
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || stopping_;
  }
  bool HasRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.size() < max_queued_ || stopping_;
  }

  const size_t max_queued_;
  const Hooks hooks_;
  ThreadChecker thread_;
  mutable absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id loop_id_ ABSL_GUARDED_BY(mu_);
  std::thread loop_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_TASK_LOOP_H_
