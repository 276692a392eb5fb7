#include "worker/stream_gate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stagewise::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(StreamGate, PendingStreamsExpireAtTheirDeadlineAndSettledOnesDoNot) {
  StreamGate gate({.max_pending = 8, .first_message_timeout = absl::Seconds(10)});
  EXPECT_EQ(gate.NextDeadline(), absl::InfiniteFuture());
  const uint64_t a = gate.Admit("peer", kT0).ticket;
  const uint64_t b = gate.Admit("peer", kT0 + absl::Seconds(4)).ticket;
  const uint64_t c = gate.Admit("other", kT0 + absl::Seconds(5)).ticket;
  EXPECT_EQ(gate.pending(), 3);
  EXPECT_EQ(gate.NextDeadline(), kT0 + absl::Seconds(10));
  gate.Settle(b);  // its first message came
  EXPECT_FALSE(gate.IsPending(b));
  EXPECT_THAT(gate.TakeExpired(kT0 + absl::Seconds(9)), IsEmpty());
  EXPECT_THAT(gate.TakeExpired(kT0 + absl::Seconds(10)), ElementsAre(a));
  EXPECT_EQ(gate.NextDeadline(), kT0 + absl::Seconds(15));
  EXPECT_THAT(gate.TakeExpired(kT0 + absl::Seconds(60)), ElementsAre(c));
  EXPECT_EQ(gate.pending(), 0);
  EXPECT_EQ(gate.expired(), 2);
  gate.Settle(a);  // unknown by now: ignored
  EXPECT_EQ(gate.pending(), 0);
}

TEST(StreamGate, ANewStreamEvictsTheOldestOfTheBusiestPeer) {
  StreamGate gate({.max_pending = 4, .first_message_timeout = absl::Seconds(10)});
  const uint64_t legit = gate.Admit("stage0", kT0).ticket;
  std::vector<uint64_t> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(gate.Admit("idler", kT0 + absl::Milliseconds(i + 1)).ticket);
  }
  EXPECT_EQ(gate.pending(), 4);
  // Full: the idler holds the most, so its oldest goes, not the older stream
  // of the peer that holds one.
  StreamGate::Admitted next = gate.Admit("idler", kT0 + absl::Milliseconds(10));
  EXPECT_THAT(next.evict, ElementsAre(idle[0]));
  EXPECT_TRUE(gate.IsPending(legit));
  next = gate.Admit("stage1", kT0 + absl::Milliseconds(11));
  EXPECT_THAT(next.evict, ElementsAre(idle[1]));
  EXPECT_TRUE(gate.IsPending(legit));
  EXPECT_EQ(gate.pending(), 4);
  EXPECT_EQ(gate.evicted(), 2);
  // Among equals, the oldest.
  StreamGate even({.max_pending = 2, .first_message_timeout = absl::Seconds(10)});
  const uint64_t first = even.Admit("x", kT0).ticket;
  even.Admit("y", kT0 + absl::Seconds(1));
  EXPECT_THAT(even.Admit("z", kT0 + absl::Seconds(2)).evict, ElementsAre(first));
}

TEST(StreamGate, TicketsAreUniqueAndACapBelowOneActsAsOne) {
  StreamGate gate({.max_pending = 0, .first_message_timeout = absl::Seconds(1)});
  const StreamGate::Admitted a = gate.Admit("p", kT0);
  const StreamGate::Admitted b = gate.Admit("p", kT0);
  EXPECT_NE(a.ticket, b.ticket);
  EXPECT_THAT(b.evict, ElementsAre(a.ticket));
  EXPECT_EQ(gate.pending(), 1);
}

}  // namespace
}  // namespace stagewise::worker
