// WorkerRegistry alone: registration, streams, heartbeat expiry on an
// explicit clock, claims and labels.
#include "coordinator/worker_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

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
  auto id = registry.Register(Info("w0"), kT0, &replaced);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "w0");
  EXPECT_FALSE(replaced.has_value());
  EXPECT_EQ(Labels(registry, "w0").at("state"), "registering");

  // No worker_id: the address is the id.
  v1::WorkerInfo anonymous = Info("");
  anonymous.set_address("10.0.0.7:7000");
  auto by_address = registry.Register(anonymous, kT0, &replaced);
  ASSERT_TRUE(by_address.ok());
  EXPECT_EQ(*by_address, "10.0.0.7:7000");

  v1::WorkerInfo no_address = Info("w9");
  no_address.clear_address();
  EXPECT_EQ(registry.Register(no_address, kT0, &replaced).status().code(),
            absl::StatusCode::kInvalidArgument);

  FakeSink sink;
  EXPECT_TRUE(registry.Connect("w0", &sink, kT0).ok());
  EXPECT_EQ(Labels(registry, "w0").at("state"), "idle");
  const absl::Status unknown = registry.Connect("nobody", &sink, kT0);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("'nobody'"));

  const WorkerRegistry::Counts counts = registry.GetCounts();
  EXPECT_EQ(counts.idle, 1);
  EXPECT_EQ(counts.busy, 0);
  EXPECT_EQ(counts.registered, 2);
}

TEST(WorkerRegistry, DisconnectOnlyRemovesTheCurrentStream) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  ASSERT_TRUE(registry.Register(Info("w0"), kT0, &replaced).ok());
  FakeSink old_stream, new_stream;
  ASSERT_TRUE(registry.Connect("w0", &old_stream, kT0).ok());
  ASSERT_TRUE(registry.Connect("w0", &new_stream, kT0).ok());
  EXPECT_FALSE(registry.Disconnect("w0", &old_stream).has_value());
  EXPECT_EQ(registry.List().size(), 1u);
  auto removed = registry.Disconnect("w0", &new_stream);
  ASSERT_TRUE(removed.has_value());
  EXPECT_EQ(removed->worker_id, "w0");
  EXPECT_TRUE(removed->job_id.empty());
  EXPECT_TRUE(registry.List().empty());
  EXPECT_FALSE(registry.Send("w0", v1::Command()));
}

TEST(WorkerRegistry, RegisteringAgainReplacesTheOldIncarnation) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  ASSERT_TRUE(registry.Register(Info("w0"), kT0, &replaced).ok());
  FakeSink sink;
  ASSERT_TRUE(registry.Connect("w0", &sink, kT0).ok());
  ASSERT_THAT(registry.Claim("job-1", 1), ElementsAre("w0"));

  ASSERT_TRUE(registry.Register(Info("w0"), kT0, &replaced).ok());
  ASSERT_TRUE(replaced.has_value());
  EXPECT_EQ(replaced->job_id, "job-1");
  EXPECT_EQ(replaced->stage, 0);
  EXPECT_TRUE(sink.closed());
  EXPECT_EQ(sink.close_status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Labels(registry, "w0").at("state"), "registering");
}

TEST(WorkerRegistry, ExpiresOnlySilentWorkersAndClosesTheirStreams) {
  WorkerRegistry registry;
  std::optional<WorkerRegistry::Removed> replaced;
  const absl::Duration timeout = absl::Seconds(10);
  FakeSink s0, s1;
  ASSERT_TRUE(registry.Register(Info("w0"), kT0, &replaced).ok());
  ASSERT_TRUE(registry.Register(Info("w1"), kT0, &replaced).ok());
  ASSERT_TRUE(registry.Connect("w0", &s0, kT0).ok());
  ASSERT_TRUE(registry.Connect("w1", &s1, kT0).ok());
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
  FakeSink sinks[3];
  for (int i = 2; i >= 0; --i) {
    const std::string id = "w" + std::to_string(i);
    ASSERT_TRUE(registry.Register(Info(id), kT0, &replaced).ok());
    ASSERT_TRUE(registry.Connect(id, &sinks[i], kT0).ok());
  }
  // A registered worker without a stream is never claimed.
  ASSERT_TRUE(registry.Register(Info("w3"), kT0, &replaced).ok());

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

}  // namespace
}  // namespace stagewise::coordinator
