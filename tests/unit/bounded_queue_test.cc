#include "services/common/bounded_queue.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace stagewise {
namespace {

TEST(BoundedQueueTest, PopReturnsItemsInOrder) {
  BoundedQueue<int> q(4);
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(q.ForcePush(i));
  EXPECT_EQ(q.size(), 3u);
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(q.Pop(), std::optional<int>(i));
  EXPECT_EQ(q.size(), 0u);
}

TEST(BoundedQueueTest, ZeroCapacityActsAsOne) {
  BoundedQueue<int> q(0);
  EXPECT_EQ(q.capacity(), 1u);
  EXPECT_TRUE(q.HasRoom());
  ASSERT_TRUE(q.ForcePush(1));
  EXPECT_FALSE(q.HasRoom());
}

TEST(BoundedQueueTest, ForcePushGoesPastCapacity) {
  BoundedQueue<std::string> q(1);
  ASSERT_TRUE(q.ForcePush("a"));
  ASSERT_TRUE(q.ForcePush("b"));
  EXPECT_EQ(q.size(), 2u);
  EXPECT_FALSE(q.HasRoom());
  EXPECT_EQ(q.Pop(), std::optional<std::string>("a"));
  EXPECT_FALSE(q.HasRoom());  // still at capacity
  EXPECT_EQ(q.Pop(), std::optional<std::string>("b"));
  EXPECT_TRUE(q.HasRoom());
}

TEST(BoundedQueueTest, PopWithTimeoutOnEmptyQueueReturnsNothing) {
  BoundedQueue<int> q(2);
  EXPECT_EQ(q.Pop(absl::Milliseconds(1)), std::nullopt);
  ASSERT_TRUE(q.ForcePush(7));
  EXPECT_EQ(q.Pop(absl::ZeroDuration()), std::optional<int>(7));
}

TEST(BoundedQueueTest, NotifyWhenRoomRunsAtOnceWhenThereIsRoom) {
  BoundedQueue<int> q(2);
  ASSERT_TRUE(q.ForcePush(1));
  int calls = 0;
  q.NotifyWhenRoom([&] { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST(BoundedQueueTest, NotifyWhenRoomRunsOnceAfterPopMakesRoom) {
  BoundedQueue<int> q(2);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q.ForcePush(i));
  int calls = 0;
  q.NotifyWhenRoom([&] { ++calls; });
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(q.Pop().has_value());  // 2 left: still full
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(q.Pop().has_value());  // room now
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(q.Pop().has_value());
  EXPECT_EQ(calls, 1);  // a callback runs once
}

TEST(BoundedQueueTest, PushWaitsForRoom) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.Push(1));
  absl::Notification pushed;
  std::thread producer([&] {
    EXPECT_TRUE(q.Push(2));
    pushed.Notify();
  });
  EXPECT_EQ(q.Pop(), std::optional<int>(1));
  pushed.WaitForNotification();
  producer.join();
  EXPECT_EQ(q.Pop(), std::optional<int>(2));
}

TEST(BoundedQueueTest, CloseWakesBlockedPopAndPushAndRunsTheRoomCallback) {
  BoundedQueue<int> empty(1);
  std::optional<int> popped = 42;
  std::thread consumer([&] { popped = empty.Pop(); });

  BoundedQueue<int> full(1);
  ASSERT_TRUE(full.ForcePush(1));
  ASSERT_TRUE(full.ForcePush(2));
  bool room_called = false;
  full.NotifyWhenRoom([&] { room_called = true; });
  bool pushed = true;
  std::thread producer([&] { pushed = full.Push(3); });

  empty.Close();
  full.Close();
  consumer.join();
  producer.join();
  EXPECT_EQ(popped, std::nullopt);
  EXPECT_FALSE(pushed);
  EXPECT_TRUE(room_called);
  EXPECT_FALSE(full.ForcePush(4));
  // What was queued before Close still drains, then Pop reports the end.
  EXPECT_EQ(full.Pop(), std::optional<int>(1));
  EXPECT_EQ(full.Pop(), std::optional<int>(2));
  EXPECT_EQ(full.Pop(), std::nullopt);
  // After Close a room callback runs at once.
  bool late = false;
  full.NotifyWhenRoom([&] { late = true; });
  EXPECT_TRUE(late);
}

}  // namespace
}  // namespace stagewise
