// TaskLoop (coordinator/task_loop.h): tasks run one at a time in order on one
// thread, the hooks between them, RunOnLoop from the loop itself, and Stop
// running what was queued before it.
#include "coordinator/task_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace stagewise::coordinator {
namespace {

// Hooks that record what ran, in order, on which thread.
struct Recorder {
  absl::Mutex mu;
  std::vector<std::string> events ABSL_GUARDED_BY(mu);
  std::thread::id loop;
  bool stopped = false;

  void Add(const std::string& e) {
    absl::MutexLock lock(&mu);
    events.push_back(e);
  }
  std::vector<std::string> Events() {
    absl::MutexLock lock(&mu);
    return events;
  }
  TaskLoop::Hooks Hooks() {
    TaskLoop::Hooks hooks;
    hooks.next_deadline = [] { return absl::Now() + absl::Hours(1); };
    hooks.after_task = [this] { Add("after"); };
    hooks.housekeeping = [] {};
    hooks.end_of_batch = [](bool) {};
    hooks.on_stop = [this] {
      stopped = true;
      Add("stop");
    };
    return hooks;
  }
};

TEST(TaskLoop, RunsTasksInOrderOnItsThreadWithTheHookAfterEach) {
  Recorder r;
  TaskLoop loop(16, r.Hooks());
  EXPECT_FALSE(loop.Post([] {}));  // before Start: dropped
  EXPECT_FALSE(loop.accepting());
  ASSERT_TRUE(loop.Start().ok());
  EXPECT_FALSE(loop.Start().ok());  // twice
  EXPECT_TRUE(loop.accepting());
  absl::Notification hold;
  std::thread::id ran_on;
  ASSERT_TRUE(loop.Post([&] {
    hold.WaitForNotification();  // the next two queue behind this one
    ran_on = std::this_thread::get_id();
    r.Add("a");
  }));
  ASSERT_TRUE(loop.Post([&] { r.Add("b"); }));
  ASSERT_TRUE(loop.Post([&] { r.Add("c"); }));
  hold.Notify();
  bool on_loop = false;
  ASSERT_TRUE(loop.RunOnLoop([&] { on_loop = loop.OnLoop(); }));
  EXPECT_TRUE(on_loop);
  EXPECT_FALSE(loop.OnLoop());  // this thread is not the loop's any more
  EXPECT_NE(ran_on, std::this_thread::get_id());
  // RunOnLoop returns once its task ran, before the hook after it: stop the
  // loop (it runs what is queued, then on_stop) before reading the record.
  loop.Stop();
  const std::vector<std::string> want = {"a", "after", "b", "after", "c", "after", "after", "stop"};
  EXPECT_EQ(r.Events(), want);
}

TEST(TaskLoop, RunOnLoopFromTheLoopRunsAtOnce) {
  Recorder r;
  TaskLoop loop(1, r.Hooks());
  ASSERT_TRUE(loop.Start().ok());
  bool inner = false;
  // A full queue (capacity 1) does not stop the loop's own RunOnLoop or Post.
  ASSERT_TRUE(loop.RunOnLoop([&] {
    EXPECT_TRUE(loop.Post([&] { r.Add("posted from the loop"); }));
    EXPECT_TRUE(loop.Post([&] { r.Add("and another"); }));
    EXPECT_TRUE(loop.RunOnLoop([&] { inner = true; }));
  }));
  EXPECT_TRUE(inner);
  loop.Stop();
  const std::vector<std::string> events = r.Events();
  EXPECT_NE(std::find(events.begin(), events.end(), "posted from the loop"), events.end());
  EXPECT_NE(std::find(events.begin(), events.end(), "and another"), events.end());
}

TEST(TaskLoop, StopRunsWhatWasQueuedThenTheStopHookAndRefusesMore) {
  Recorder r;
  TaskLoop loop(64, r.Hooks());
  loop.BindCaller();
  EXPECT_TRUE(loop.OnLoop());  // the caller owns the state until the loop runs
  ASSERT_TRUE(loop.Start().ok());
  absl::Notification hold;
  ASSERT_TRUE(loop.Post([&] { hold.WaitForNotification(); }));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(loop.Post([&r, i] { r.Add(std::to_string(i)); }));
  std::thread stopper([&] { loop.Stop(); });
  hold.Notify();
  stopper.join();
  EXPECT_TRUE(r.stopped);
  const std::vector<std::string> events = r.Events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "stop");
  int ran = 0;
  for (const std::string& e : events) ran += e != "after" && e != "stop" ? 1 : 0;
  EXPECT_EQ(ran, 10);
  EXPECT_FALSE(loop.Post([] {}));
  EXPECT_FALSE(loop.RunOnLoop([] {}));
  loop.Stop();  // again: nothing
}

}  // namespace
}  // namespace stagewise::coordinator
