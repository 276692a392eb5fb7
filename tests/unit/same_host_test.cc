// The same-host handshake of worker/same_host.h between two links, as stage j
// and stage j+1 run it over their stream (no gRPC needed).
#include "worker/same_host.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace stagewise::worker {
namespace {

class SameHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/same_host_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SameHostTest, BothSidesOpenTheOthersRingOnceEachAnswered) {
  SameHostLink j(dir_, 1 << 16), next(dir_, 1 << 16);
  const v1::SharedRingOffer open = j.Offer(false);  // in OPEN
  ASSERT_FALSE(open.name().empty());
  EXPECT_EQ(j.ring(), nullptr);  // not before the answer
  const bool next_opened = next.Accept(open);
  EXPECT_TRUE(next_opened);
  const v1::SharedRingOffer answer = next.Offer(next_opened);  // RING from j+1
  j.PeerAnswered(answer.opened_peer());
  ASSERT_NE(j.ring(), nullptr);
  next.PeerAnswered(j.Accept(answer));  // RING from j
  ASSERT_NE(next.ring(), nullptr);
  // Both files are gone from the directory: each reader unlinked its peer's.
  EXPECT_TRUE(std::filesystem::is_empty(dir_));

  // A payload from j reaches next through j's ring and nowhere else.
  v1::StageMessage m;
  v1::TensorProto& t = (*m.mutable_tensors())["x"];
  auto region = j.ring()->Allocate(4);
  ASSERT_TRUE(region.has_value());
  std::memcpy(region->data, "abcd", 4);
  t.mutable_shared()->set_offset(region->offset);
  t.mutable_shared()->set_length(4);
  v1::StageMessage copy = m;
  ASSERT_TRUE(next.Resolve(&m).ok());
  EXPECT_EQ(m.tensors().at("x").data(), "abcd");
  EXPECT_FALSE(m.tensors().at("x").has_shared());
  EXPECT_FALSE(next.Resolve(&copy).ok());  // taken already
  SameHostLink stranger("", 1 << 16);
  absl::Status refused = stranger.Resolve(&copy);
  EXPECT_NE(refused.message().find("did not agree on a ring"), std::string::npos) << refused;
}

TEST_F(SameHostTest, APeerThatCannotOpenTheRingLeavesPayloadsInlineAndFreesIt) {
  SameHostLink j(dir_, 1 << 16);
  SameHostLink elsewhere("", 1 << 16);  // off, as on another host
  const v1::SharedRingOffer open = j.Offer(false);
  EXPECT_FALSE(elsewhere.Accept(open));
  EXPECT_TRUE(elsewhere.Offer(false).name().empty());
  j.PeerAnswered(false);
  EXPECT_EQ(j.ring(), nullptr);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));  // the ring is given back
  j.PeerAnswered(true);                          // a second answer changes nothing
  EXPECT_EQ(j.ring(), nullptr);
  // An offer of a ring that is not in this host's memory (no such file).
  v1::SharedRingOffer forged = open;
  forged.set_name("stagewise-ring-0000000000000000");
  SameHostLink other(dir_, 1 << 16);
  EXPECT_FALSE(other.Accept(forged));
}

}  // namespace
}  // namespace stagewise::worker
