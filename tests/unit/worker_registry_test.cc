// WorkerRegistry alone: registration, streams, heartbeat expiry on an
// explicit clock, claims and labels.
#include "coordinator/worker_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/common/version.h"
#include "tests/unit/coordinator_fakes.h"

namespace stagewise::coordinator {
namespace {

using ::testing::ElementsAre;
using testing::FakeSink;
using ::testing::HasSubstr;
using testing::Info;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

std::map<std::string, std::string> Labels(const WorkerRegistry& registry, const std::string& id) {
  for (const v1::WorkerInfo& info : registry.List()) {
    if (info.worker_id() == id) return {info.labels().begin(), info.labels().end()};
  }
  return {};
}

TEST(WorkerRegistry, RegisterConnectAndList) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session, session1;
  auto id = registry.Register(Info("w0"), {}, kT0, &replaced, &session);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "w0");
  const std::string w0_session = session;
  EXPECT_EQ(session.size(), 32u);
  EXPECT_FALSE(replaced.has_value());
  EXPECT_EQ(Labels(registry, "w0").at("state"), "registering");

  // No worker_id: the address is the id.
  v1::WorkerInfo anonymous = Info("");
  anonymous.set_address("10.0.0.7:7000");
  auto by_address = registry.Register(anonymous, {}, kT0, &replaced, &session);
  ASSERT_TRUE(by_address.ok());
  EXPECT_EQ(*by_address, "10.0.0.7:7000");

  v1::WorkerInfo no_address = Info("w9");
  no_address.clear_address();
  EXPECT_EQ(registry.Register(no_address, {}, kT0, &replaced, &session).status().code(),
            absl::StatusCode::kInvalidArgument);

  FakeSink sink;
  EXPECT_NE(session, w0_session);
  EXPECT_EQ(registry.Connect("w0", session, {}, &sink, kT0).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(registry.Connect("w0", w0_session, {}, &sink, kT0).ok());
  EXPECT_EQ(Labels(registry, "w0").at("state"), "idle");
  const absl::Status unknown = registry.Connect("nobody", session, {}, &sink, kT0);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("'nobody'"));

  const WorkerRegistry::Counts counts = registry.GetCounts();
  EXPECT_EQ(counts.idle, 1);
  EXPECT_EQ(counts.busy, 0);
  EXPECT_EQ(counts.registered, 2);
}

TEST(WorkerRegistry, OneStreamPerRegistrationAndOnlyItsOwnSessionAndIdentity) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session;
  ASSERT_TRUE(registry.Register(Info("w0"), {.identity = "worker"}, kT0, &replaced, &session).ok());
  FakeSink thief, first, second;
  // Someone else's identity with the right session, the right identity with
  // no session: both refused.
  EXPECT_EQ(registry.Connect("w0", session, {.identity = "client"}, &thief, kT0).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry.Connect("w0", "", {.identity = "worker"}, &thief, kT0).code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(registry.Connect("w0", session, {.identity = "worker"}, &first, kT0).ok());
  EXPECT_EQ(registry.Connect("w0", session, {.identity = "worker"}, &second, kT0).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(registry.Disconnect("w0", &second).has_value());
  EXPECT_EQ(registry.List().size(), 1u);
  auto removed = registry.Disconnect("w0", &first);
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->worker_id, "w0");
  EXPECT_TRUE(removed->job_id.empty());
  EXPECT_TRUE(registry.List().empty());
  EXPECT_FALSE(registry.Send("w0", v1::Command()));
}

TEST(WorkerRegistry, AConnectedWorkersIdCannotBeTakenButAnUnconnectedOneIsReplaced) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session, again;
  ASSERT_TRUE(registry.Register(Info("w0"), {}, kT0, &replaced, &session).ok());
  // Registered again before its stream opened (a quick restart): replaced.
  ASSERT_TRUE(registry.Register(Info("w0"), {}, kT0, &replaced, &again).ok());
  ASSERT_TRUE(replaced.has_value());
  EXPECT_NE(again, session);
  FakeSink sink;
  EXPECT_EQ(registry.Connect("w0", session, {}, &sink, kT0).code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(registry.Connect("w0", again, {}, &sink, kT0).ok());
  ASSERT_THAT(registry.Claim("job-1", 1), ElementsAre("w0"));
  // While its stream is open the id is taken: the job is left alone.
  std::string impostor;
  auto taken = registry.Register(Info("w0"), {}, kT0, &replaced, &impostor);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(replaced.has_value());
  EXPECT_FALSE(sink.closed());
  EXPECT_EQ(Labels(registry, "w0").at("state"), "busy");
  // Once the stream closed, the restarted worker registers again.
  ASSERT_TRUE(registry.Disconnect("w0", &sink).has_value());
  EXPECT_TRUE(registry.Register(Info("w0"), {}, kT0, &replaced, &impostor).ok());
}

TEST(WorkerRegistry, RefusesBadWorkerInfo) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session;
  v1::WorkerInfo escape = Info("w\x1b[2J");
  auto s = registry.Register(escape, {}, kT0, &replaced, &session);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("WorkerInfo.worker_id"));
  v1::WorkerInfo long_id = Info(std::string(1000, 'w'));
  EXPECT_THAT(registry.Register(long_id, {}, kT0, &replaced, &session).status().message(),
              HasSubstr("at most 128"));
  v1::WorkerInfo labels = Info("w0");
  for (int i = 0; i < 40; ++i) (*labels.mutable_labels())["k" + std::to_string(i)] = "v";
  EXPECT_THAT(registry.Register(labels, {}, kT0, &replaced, &session).status().message(),
              HasSubstr("WorkerInfo.labels"));
  // A worker of another version: its events and stage streams would be misread.
  for (v1::ControlProtocol old : {v1::CONTROL_PROTOCOL_UNSPECIFIED, v1::CONTROL_PROTOCOL_V2,
                                  v1::CONTROL_PROTOCOL_V3, v1::CONTROL_PROTOCOL_V4}) {
    v1::WorkerInfo info = Info("w1");
    info.set_protocol(old);
    auto refused = registry.Register(info, {}, kT0, &replaced, &session);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(),
                HasSubstr(absl::StrCat("control protocol ", static_cast<int>(old))));
  }
  // Another version line: refused naming both; the same line, or a worker
  // that does not say, is taken.
  v1::WorkerInfo newer = Info("w2");
  newer.set_version("7.1.0");
  auto refused = registry.Register(newer, {}, kT0, &replaced, &session);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("the worker w2 runs stagewise 7.1.0"));
  EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("this coordinator ", Version())));
  v1::WorkerInfo garbled = Info("w2");
  garbled.set_version("latest");
  EXPECT_EQ(registry.Register(garbled, {}, kT0, &replaced, &session).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.List().empty());
  v1::WorkerInfo same = Info("w3");
  same.set_version(Version());
  EXPECT_TRUE(registry.Register(same, {}, kT0, &replaced, &session).ok());
}

TEST(WorkerRegistry, ExpiresOnlySilentWorkersAndClosesTheirStreams) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session, session1;
  const absl::Duration timeout = absl::Seconds(10);
  FakeSink s0, s1;
  ASSERT_TRUE(registry.Register(Info("w0"), {}, kT0, &replaced, &session).ok());
  ASSERT_TRUE(registry.Register(Info("w1"), {}, kT0, &replaced, &session1).ok());
  ASSERT_TRUE(registry.Connect("w0", session, {}, &s0, kT0).ok());
  ASSERT_TRUE(registry.Connect("w1", session1, {}, &s1, kT0).ok());
  ASSERT_THAT(registry.Claim("job-1", 2), ElementsAre("w0", "w1"));
  EXPECT_EQ(registry.NextExpiry(timeout), kT0 + timeout);

  EXPECT_TRUE(registry.Touch("w0", kT0 + absl::Seconds(8)));
  EXPECT_FALSE(registry.Touch("nobody", kT0));
  EXPECT_TRUE(registry.Expire(kT0 + timeout, timeout).empty());  // not more than the timeout yet
  auto lost = registry.Expire(kT0 + absl::Seconds(11), timeout);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].worker_id, "w1");
  EXPECT_EQ(lost[0].job_id, "job-1");
  EXPECT_EQ(lost[0].stage, 1);
  EXPECT_TRUE(s1.closed());
  EXPECT_EQ(s1.close_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(s0.closed());
  EXPECT_EQ(registry.NextExpiry(timeout), kT0 + absl::Seconds(18));
}

TEST(WorkerRegistry, ClaimIsAllOrNothingInIdOrderAndReleaseFrees) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session, session1;
  FakeSink sinks[3];
  for (int i = 2; i >= 0; --i) {
    const std::string id = "w" + std::to_string(i);
    ASSERT_TRUE(registry.Register(Info(id), {}, kT0, &replaced, &session).ok());
    ASSERT_TRUE(registry.Connect(id, session, {}, &sinks[i], kT0).ok());
  }
  // A registered worker without a stream is never claimed.
  ASSERT_TRUE(registry.Register(Info("w3"), {}, kT0, &replaced, &session).ok());

  EXPECT_TRUE(registry.Claim("big", 4).empty());
  EXPECT_EQ(registry.GetCounts().idle, 3);
  EXPECT_THAT(registry.Claim("a", 2), ElementsAre("w0", "w1"));
  EXPECT_EQ(Labels(registry, "w1").at("state"), "busy");
  EXPECT_EQ(Labels(registry, "w1").at("job"), "a");
  EXPECT_EQ(Labels(registry, "w1").at("stage"), "1");
  EXPECT_TRUE(registry.Claim("b", 2).empty());
  EXPECT_THAT(registry.Claim("c", 1), ElementsAre("w2"));
  EXPECT_THAT(registry.Release("a"), ElementsAre("w0", "w1"));
  EXPECT_TRUE(registry.Release("a").empty());
  EXPECT_EQ(Labels(registry, "w0").at("state"), "idle");
  EXPECT_EQ(Labels(registry, "w0").count("job"), 0u);

  v1::Command c;
  c.set_command_id(7);
  EXPECT_TRUE(registry.Send("w2", c));
  ASSERT_EQ(sinks[2].commands().size(), 1u);
  EXPECT_EQ(sinks[2].commands()[0].command_id(), 7);
  EXPECT_FALSE(registry.Send("w3", c));  // no stream yet
}

// placement.labels: a claim takes only workers registered with every
// "key=value" asked for, and says how many such workers are idle.
TEST(WorkerRegistry, ClaimTakesOnlyWorkersWithTheLabels) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session;
  FakeSink sinks[4];
  for (int i = 0; i < 4; ++i) {
    const std::string id = "w" + std::to_string(i);
    v1::WorkerInfo info = Info(id);
    if (i >= 1) (*info.mutable_labels())["gpu"] = i == 3 ? "h100" : "a100";
    if (i == 2) (*info.mutable_labels())["zone"] = "b";
    ASSERT_TRUE(registry.Register(info, {}, kT0, &replaced, &session).ok());
    ASSERT_TRUE(registry.Connect(id, session, {}, &sinks[i], kT0).ok());
  }
  EXPECT_EQ(registry.IdleWith({"gpu=a100"}), 2);
  EXPECT_EQ(registry.IdleWith({"gpu=a100", "zone=b"}), 1);
  EXPECT_EQ(registry.IdleWith({}), 4);
  EXPECT_TRUE(registry.Claim("big", 3, false, 0, {"gpu=a100"}).empty());
  EXPECT_THAT(registry.Claim("a", 1, false, 0, {"gpu=a100", "zone=b"}), ElementsAre("w2"));
  EXPECT_THAT(registry.Claim("b", 1, false, 0, {"gpu=a100"}), ElementsAre("w1"));
  EXPECT_TRUE(registry.Claim("c", 1, false, 0, {"gpu=a100"}).empty());
  EXPECT_TRUE(registry.Claim("d", 1, false, 0, {"gpu"}).empty());  // not key=value: none
  EXPECT_THAT(registry.Claim("e", 1, false, 0, {"gpu=h100"}), ElementsAre("w3"));
  EXPECT_EQ(Labels(registry, "w3").at("gpu"), "h100");
}

TEST(WorkerRegistry, ADrainingWorkerIsNeverClaimedAgainUntilItRegistersAfresh) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  std::string session;
  FakeSink sinks[3];
  for (int i = 0; i < 2; ++i) {
    const std::string id = "w" + std::to_string(i);
    ASSERT_TRUE(registry.Register(Info(id), {}, kT0, &replaced, &session).ok());
    ASSERT_TRUE(registry.Connect(id, session, {}, &sinks[i], kT0).ok());
  }
  ASSERT_THAT(registry.Claim("job", 1, false, 0, {}), ElementsAre("w0"));
  EXPECT_EQ(registry.MarkDraining("w0"), std::optional<std::string>("job"));
  EXPECT_EQ(registry.MarkDraining("w1"), std::optional<std::string>(""));
  EXPECT_EQ(registry.MarkDraining("nobody"), std::nullopt);
  EXPECT_EQ(Labels(registry, "w0").at("state"), "draining");
  registry.Release("job");
  EXPECT_EQ(registry.GetCounts().idle, 0);
  EXPECT_EQ(registry.IdleWith({}), 0);
  EXPECT_TRUE(registry.Claim("next", 1, false, 0, {}).empty());
  // Restarted under the same name: a new registration, claimable again.
  ASSERT_TRUE(registry.Disconnect("w0", &sinks[0]).has_value());
  ASSERT_TRUE(registry.Register(Info("w0"), {}, kT0, &replaced, &session).ok());
  ASSERT_TRUE(registry.Connect("w0", session, {}, &sinks[2], kT0).ok());
  EXPECT_THAT(registry.Claim("next", 1, false, 0, {}), ElementsAre("w0"));
}

}  // namespace
}  // namespace stagewise::coordinator
