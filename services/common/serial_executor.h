// One thread that runs posted tasks one at a time, in order, from a bounded
// queue. Posting never blocks (false when the queue is full or the executor
// stopped), so a thread that must stay responsive (a gRPC reactor, a control
// stream's reader) hands slow work to it and goes on.
#ifndef STAGEWISE_SERVICES_COMMON_SERIAL_EXECUTOR_H_
#define STAGEWISE_SERVICES_COMMON_SERIAL_EXECUTOR_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "services/common/bounded_queue.h"

namespace stagewise {

class SerialExecutor {
 public:
  using Task = std::function<void()>;

  explicit SerialExecutor(size_t capacity)
      : tasks_(capacity), thread_([this] {
          while (std::optional<Task> task = tasks_.Pop()) (*task)();
        }) {}
  ~SerialExecutor() { Stop(); }
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Never blocks. False (the task is dropped) when `capacity` tasks wait or
  // the executor stopped.
  bool Post(Task task) {
    if (!tasks_.HasRoom()) return false;
    return tasks_.ForcePush(std::move(task));
  }

  // Runs the tasks already posted, then joins the thread. Later posts fail.
  void Stop() {
    tasks_.Close();
    if (thread_.joinable()) thread_.join();
  }

  bool OnExecutorThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  BoundedQueue<Task> tasks_;
  std::thread thread_;
};

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_SERIAL_EXECUTOR_H_
