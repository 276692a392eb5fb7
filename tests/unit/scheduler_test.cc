// Scheduler alone: FIFO with backfill over a real WorkerRegistry with fake
// streams, the commands it builds, and plans from a worker's profile.
#include "coordinator/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "services/planner/plan_proto.h"
#include "services/planner/profile.h"
#include "tests/unit/coordinator_fakes.h"

namespace stagewise::coordinator {
namespace {

using ::testing::ElementsAre;
using testing::FakeSink;
using ::testing::HasSubstr;
using testing::Info;

class SchedulerTest : public ::testing::Test {
 protected:
  void AddWorker(const std::string& id, int64_t memory_bytes = 0,
                 const std::string& identity = "") {
    std::optional<WorkerRegistry::Removed> replaced;
    std::string session;
    const WorkerRegistry::Caller caller{identity};
    ASSERT_TRUE(
        registry_.Register(Info(id, memory_bytes), caller, absl::Now(), &replaced, &session).ok());
    sinks_.push_back(std::make_unique<FakeSink>());
    ASSERT_TRUE(registry_.Connect(id, session, caller, sinks_.back().get(), absl::Now()).ok());
  }
  static std::vector<std::string> Ids(const std::vector<Scheduler::Placement>& placed) {
    std::vector<std::string> ids;
    for (const auto& p : placed) ids.push_back(p.job_id);
    return ids;
  }

  std::vector<std::unique_ptr<FakeSink>> sinks_;
  WorkerRegistry registry_;
  Scheduler scheduler_{&registry_};
};

TEST_F(SchedulerTest, FifoWithBackfill) {
  AddWorker("w0");
  AddWorker("w1");
  AddWorker("w2");
  scheduler_.Enqueue({"a", 2, false});
  scheduler_.Enqueue({"b", 3, false});
  scheduler_.Enqueue({"c", 1, true});
  Scheduler::Round round = scheduler_.Schedule(absl::Now());
  // a takes w0, w1; b (3) does not fit and keeps its place; c backfills w2.
  ASSERT_THAT(Ids(round.placed), ElementsAre("a", "c"));
  EXPECT_THAT(round.placed[0].workers, ElementsAre("w0", "w1"));
  EXPECT_FALSE(round.placed[0].profile);
  EXPECT_THAT(round.placed[1].workers, ElementsAre("w2"));
  EXPECT_TRUE(round.placed[1].profile);
  ASSERT_EQ(round.waiting.size(), 1u);
  EXPECT_EQ(round.waiting[0].job_id, "b");
  EXPECT_EQ(round.waiting[0].reason, "waiting for 3 idle workers (1 idle, 3 registered)");
  EXPECT_TRUE(scheduler_.Queued("b"));
  EXPECT_FALSE(scheduler_.Queued("a"));

  // d arrives after b: when a's workers come back, b still does not fit, d does.
  scheduler_.Enqueue({"d", 2, false});
  registry_.Release("a");
  round = scheduler_.Schedule(absl::Now());
  EXPECT_THAT(Ids(round.placed), ElementsAre("d"));
  ASSERT_EQ(round.waiting.size(), 1u);
  EXPECT_EQ(round.waiting[0].reason, "waiting for 3 idle workers (2 idle, 3 registered)");

  // Everything idle again: b, first in line, goes before e.
  scheduler_.Enqueue({"e", 1, false});
  registry_.Release("c");
  registry_.Release("d");
  round = scheduler_.Schedule(absl::Now());
  EXPECT_THAT(Ids(round.placed), ElementsAre("b"));
  ASSERT_EQ(round.waiting.size(), 1u);
  EXPECT_EQ(round.waiting[0].job_id, "e");
  EXPECT_EQ(round.waiting[0].reason, "waiting for 1 idle workers (0 idle, 3 registered)");
  EXPECT_TRUE(scheduler_.Remove("e"));
  EXPECT_FALSE(scheduler_.Remove("e"));
  EXPECT_EQ(scheduler_.size(), 0u);
}

TEST_F(SchedulerTest, StageAssignmentsChainTheStages) {
  AddWorker("w0");
  AddWorker("w1");
  const std::vector<v1::Command> commands = scheduler_.StageAssignments(
      "job-1", "yaml", {"w1", "w0"},
      {.ranges = {{0, 3}, {3, 5}},
       .modes = {{BlockMode::kStore, BlockMode::kRebuild, BlockMode::kStore}}});
  ASSERT_EQ(commands.size(), 2u);
  const v1::StageAssignment& a0 = commands[0].configure();
  const v1::StageAssignment& a1 = commands[1].configure();
  EXPECT_EQ(a0.job_id(), "job-1");
  EXPECT_EQ(a0.stage(), 0);
  EXPECT_EQ(a0.num_stages(), 2);
  EXPECT_EQ(a0.block_begin(), 0);
  EXPECT_EQ(a0.block_end(), 3);
  EXPECT_EQ(a0.next_address(), "w0.example:7000");
  EXPECT_EQ(a0.job_spec_yaml(), "yaml");
  EXPECT_THAT(a0.block_modes(),
              ElementsAre(v1::BLOCK_MODE_STORE, v1::BLOCK_MODE_REBUILD, v1::BLOCK_MODE_STORE));
  EXPECT_EQ(a1.stage(), 1);
  EXPECT_EQ(a1.block_begin(), 3);
  EXPECT_EQ(a1.block_end(), 5);
  EXPECT_EQ(a1.next_address(), "");
  EXPECT_TRUE(a1.block_modes().empty());

  const v1::Command profile = Scheduler::ProfileCommand("job-1", "yaml");
  EXPECT_EQ(profile.profile().job_id(), "job-1");
  EXPECT_EQ(profile.profile().job_spec_yaml(), "yaml");
}

TEST_F(SchedulerTest, StagesGoToDistinctCertificateIdentities) {
  AddWorker("w0", 0, "worker-a");
  AddWorker("w1", 0, "worker-a");  // the same certificate as w0
  AddWorker("w2", 0, "worker-b");
  Scheduler::Request shared{"shared", 2, false};
  shared.distinct_identities = true;
  scheduler_.Enqueue(shared);
  Scheduler::Round round = scheduler_.Schedule(absl::Now());
  ASSERT_THAT(Ids(round.placed), ElementsAre("shared"));
  EXPECT_THAT(round.placed[0].workers, ElementsAre("w0", "w2"));  // w1 skipped
  // Two more stages: w1 is idle, but there is one identity left.
  Scheduler::Request more{"more", 2, false};
  more.distinct_identities = true;
  scheduler_.Enqueue(more);
  registry_.Release("shared");
  AddWorker("w3", 0, "worker-a");
  round = scheduler_.Schedule(absl::Now());
  ASSERT_THAT(Ids(round.placed), ElementsAre("more"));
  EXPECT_THAT(round.placed[0].workers, ElementsAre("w0", "w2"));
  Scheduler::Request three{"three", 2, false};
  three.distinct_identities = true;
  scheduler_.Enqueue(three);
  round = scheduler_.Schedule(absl::Now());  // w1 and w3 are idle: both worker-a
  EXPECT_TRUE(round.placed.empty());
  ASSERT_EQ(round.waiting.size(), 1u);
  EXPECT_EQ(round.waiting[0].reason,
            "waiting for 2 idle workers with distinct certificate identities (2 idle, 4 "
            "registered; placement.distinct_identities: false lifts this)");
  // Without the rule, one certificate may hold both.
  scheduler_.Remove("three");
  scheduler_.Enqueue({"any", 2, false});
  round = scheduler_.Schedule(absl::Now());
  ASSERT_THAT(Ids(round.placed), ElementsAre("any"));
  EXPECT_THAT(round.placed[0].workers, ElementsAre("w1", "w3"));
  // The assignments name the neighbours' identities.
  const std::vector<v1::Command> commands =
      scheduler_.StageAssignments("job-1", "yaml", {"w0", "w2", "w1"}, Cut{});
  ASSERT_EQ(commands.size(), 3u);
  EXPECT_EQ(commands[0].configure().prev_identity(), "");
  EXPECT_EQ(commands[0].configure().next_identity(), "worker-b");
  EXPECT_EQ(commands[1].configure().prev_identity(), "worker-a");
  EXPECT_EQ(commands[1].configure().next_identity(), "worker-a");
  EXPECT_EQ(commands[2].configure().prev_identity(), "worker-b");
  EXPECT_EQ(commands[2].configure().next_identity(), "");
}

TEST_F(SchedulerTest, ASettlingRecoveryKeepsItsPlaceUntilItsTime) {
  AddWorker("w0");
  AddWorker("w1");
  const absl::Time now = absl::Now();
  Scheduler::Request recovering{"r", 1, false};
  recovering.not_before = now + absl::Seconds(1);
  scheduler_.Requeue(recovering);
  scheduler_.Enqueue({"new", 1, false});
  Scheduler::Round round = scheduler_.Schedule(now);
  EXPECT_THAT(Ids(round.placed), ElementsAre("new"));  // r waits, without a reason
  EXPECT_TRUE(round.waiting.empty());
  EXPECT_TRUE(scheduler_.Queued("r"));
  EXPECT_EQ(scheduler_.NextDue(), now + absl::Seconds(1));
  round = scheduler_.Schedule(now + absl::Seconds(1));
  EXPECT_THAT(Ids(round.placed), ElementsAre("r"));
  EXPECT_EQ(scheduler_.NextDue(), absl::InfiniteFuture());
}

// recovery.elastic: a recovering job of 2 stages x 3 replicas finds 5 idle
// workers and takes 2 x 2 of them (slots by replica) instead of waiting; with
// fewer than one whole pipeline it waits and says for how many.
TEST_F(SchedulerTest, AnElasticRecoveryTakesFewerReplicasWhenShortOfWorkers) {
  for (int i = 0; i < 5; ++i) AddWorker("w" + std::to_string(i));
  Scheduler::Request elastic{"e", 6, false};
  elastic.stages = 2;
  elastic.fewer_replicas = {2, 1};
  scheduler_.Requeue(elastic);
  Scheduler::Round round = scheduler_.Schedule(absl::Now());
  ASSERT_THAT(Ids(round.placed), ElementsAre("e"));
  EXPECT_THAT(round.placed[0].workers, ElementsAre("w0", "w1", "w2", "w3"));
  // The registry knows each worker's stage and replica (`stagewise workers`).
  std::map<std::string, std::pair<std::string, std::string>> where;
  for (const v1::WorkerInfo& info : registry_.List()) {
    if (info.labels().at("state") != "busy") continue;
    where[info.worker_id()] = {info.labels().at("stage"), info.labels().at("replica")};
  }
  EXPECT_EQ(where["w0"], std::make_pair(std::string("0"), std::string("0")));
  EXPECT_EQ(where["w1"], std::make_pair(std::string("1"), std::string("0")));
  EXPECT_EQ(where["w2"], std::make_pair(std::string("0"), std::string("1")));
  EXPECT_EQ(where["w3"], std::make_pair(std::string("1"), std::string("1")));

  // One idle worker left: not even one pipeline of 2 stages.
  Scheduler::Request short_of{"s", 4, false};
  short_of.stages = 2;
  short_of.fewer_replicas = {1};
  scheduler_.Requeue(short_of);
  round = scheduler_.Schedule(absl::Now());
  EXPECT_TRUE(round.placed.empty());
  ASSERT_EQ(round.waiting.size(), 1u);
  EXPECT_THAT(round.waiting[0].reason,
              HasSubstr("waiting for 4 idle workers (recovery.elastic: at least 2)"));
  // Without elastic the same shortage of a 2 x 2 job just waits for 4.
  registry_.Release("e");
  Scheduler::Request rigid{"r", 6, false};
  rigid.stages = 2;
  scheduler_.Remove("s");
  scheduler_.Requeue(rigid);
  round = scheduler_.Schedule(absl::Now());
  EXPECT_TRUE(round.placed.empty());
}

TEST_F(SchedulerTest, ARecoveryAllowedFewerStagesTakesTheMostThatAreIdle) {
  for (int i = 0; i < 3; ++i) AddWorker("w" + std::to_string(i));
  // Four stages wanted, three idle: without fewer_stages it waits.
  Scheduler::Request rigid{"r", 4, false};
  rigid.stages = 4;
  scheduler_.Requeue(rigid);
  Scheduler::Round round = scheduler_.Schedule(absl::Now());
  EXPECT_TRUE(round.placed.empty());
  scheduler_.Remove("r");
  // recovery.min_stages 2, past its wait: three stages on the three idle.
  Scheduler::Request fewer{"f", 4, false};
  fewer.stages = 4;
  fewer.fewer_stages = {3, 2};
  scheduler_.Requeue(fewer);
  round = scheduler_.Schedule(absl::Now());
  ASSERT_THAT(Ids(round.placed), ElementsAre("f"));
  EXPECT_THAT(round.placed[0].workers, ElementsAre("w0", "w1", "w2"));
  // None idle: it waits, saying how few would do.
  Scheduler::Request more{"m", 4, false};
  more.stages = 4;
  more.fewer_stages = {3, 2};
  scheduler_.Requeue(more);
  round = scheduler_.Schedule(absl::Now());
  EXPECT_TRUE(round.placed.empty());
  ASSERT_EQ(round.waiting.size(), 1u);
  EXPECT_THAT(round.waiting[0].reason,
              HasSubstr("waiting for 4 idle workers (recovery.min_stages: at least 2)"));
}

// Four blocks, each slower than the one before.
planner::ModelProfile FourBlocks() {
  planner::ModelProfile p = testing::EqualBlocks(4);
  for (int i = 0; i < 4; ++i) {
    planner::BlockProfile& b = p.blocks[i];
    b.forward_s = b.forward_nograd_s = 0.01 * (i + 1);
    b.backward_s = 2 * b.forward_s;
    b.parameter_bytes = 4096;
  }
  return p;
}

TEST_F(SchedulerTest, PlanFromProfilePartitionsAndSummarises) {
  AddWorker("w0");
  AddWorker("w1");
  auto spec = ParseJobSpec(testing::JobYaml(2, 4));
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->stages.partition = Partition::kAuto;
  v1::ProfileResult result;
  *result.mutable_profile() = planner::ToProto(FourBlocks());
  auto planned = scheduler_.PlanFromProfile(*spec, {}, result, {"w0", "w1"});
  ASSERT_TRUE(planned.ok()) << planned.status();
  ASSERT_EQ(planned->cut.ranges.size(), 2u);
  EXPECT_EQ(planned->cut.ranges[0].first, 0);
  EXPECT_EQ(planned->cut.ranges[0].second, planned->cut.ranges[1].first);
  EXPECT_EQ(planned->cut.ranges[1].second, 4);
  ASSERT_EQ(planned->cut.modes.size(), 2u);
  EXPECT_EQ(planned->cut.modes[0].size(),
            static_cast<size_t>(planned->cut.ranges[0].second - planned->cut.ranges[0].first));
  bool has_cut = false;
  for (const auto& [key, value] : planned->summary) {
    if (key == "plan.stage1.block_begin") has_cut = value == planned->cut.ranges[1].first;
  }
  EXPECT_TRUE(has_cut);

  result.mutable_profile()->mutable_blocks(1)->set_index(7);  // out of order
  auto bad = scheduler_.PlanFromProfile(*spec, {}, result, {"w0", "w1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("profile from the worker"));
}

}  // namespace
}  // namespace stagewise::coordinator
