#include "coordinator/task_loop.h"

#include <memory>
#include <utility>

#include "absl/synchronization/notification.h"

namespace stagewise::coordinator {

absl::Status TaskLoop::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (running_ || stopping_) return absl::FailedPreconditionError("TaskLoop: started twice");
    running_ = true;
  }
  loop_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void TaskLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
}

bool TaskLoop::Post(Task task) {
  absl::MutexLock lock(&mu_);
  if (!running_ || stopping_) return false;
  // The loop itself never waits for room (it is the one making room).
  if (std::this_thread::get_id() != loop_id_) {
    mu_.Await(absl::Condition(this, &TaskLoop::HasRoomLocked));
    if (stopping_) return false;
  }
  queue_.push_back(std::move(task));
  return true;
}

bool TaskLoop::RunOnLoop(Task task) {
  bool on_loop = false;
  {
    absl::MutexLock lock(&mu_);
    on_loop = running_ && std::this_thread::get_id() == loop_id_;
  }
  if (on_loop) {
    task();
    return true;
  }
  auto done = std::make_shared<absl::Notification>();
  if (!Post([task = std::move(task), done] {
        task();
        done->Notify();
      })) {
    return false;
  }
  // Stop runs every task queued before it, so this always returns.
  done->WaitForNotification();
  return true;
}

void TaskLoop::Run() {
  {
    absl::MutexLock lock(&mu_);
    loop_id_ = std::this_thread::get_id();
  }
  thread_.Bind();
  for (;;) {
    const absl::Time deadline = hooks_.next_deadline();
    std::deque<Task> tasks;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(this, &TaskLoop::HasWorkLocked), deadline);
      tasks.swap(queue_);
      stopping = stopping_;
    }
    for (Task& task : tasks) {
      task();
      hooks_.after_task();
    }
    hooks_.housekeeping();
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      idle = queue_.empty();
    }
    hooks_.end_of_batch(idle);
    if (stopping && idle) break;
  }
  hooks_.on_stop();
}

}  // namespace stagewise::coordinator
