#include <sqlite3.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/job_store_fixtures.h"

namespace stagewise::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::MakeJob;
using testing::OpenOrDie;
using testing::TempDir;

std::vector<std::string> Ids(const std::vector<v1::JobStatus>& jobs) {
  std::vector<std::string> ids;
  for (const v1::JobStatus& job : jobs) ids.push_back(job.job_id());
  return ids;
}

std::vector<std::string> Ids(const std::vector<JobRecord>& jobs) {
  std::vector<std::string> ids;
  for (const JobRecord& job : jobs) ids.push_back(job.status.job_id());
  return ids;
}

// One PRAGMA through a separate raw connection, as an operator's sqlite3
// shell would see the file.
std::string RawPragma(const std::string& path, const std::string& pragma) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string value;
  if (sqlite3_prepare_v2(db, pragma.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

TEST(JobStoreTest, CreateAndGetRoundTrip) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  JobRecord record = MakeJob("job-00000001");
  record.status.set_state(v1::RUNNING);  // ignored: new jobs are PENDING
  record.status.set_reason("waiting for 4 workers");
  const int64_t before = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE(store->CreateJob(record).ok());

  absl::StatusOr<JobRecord> got = store->GetJob("job-00000001");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status.job_id(), "job-00000001");
  EXPECT_EQ(got->status.name(), "name-of-job-00000001");
  EXPECT_EQ(got->status.state(), v1::PENDING);
  EXPECT_EQ(got->status.reason(), "waiting for 4 workers");
  EXPECT_EQ(got->status.algorithm(), "petra");
  EXPECT_EQ(got->status.num_stages(), 4);
  EXPECT_EQ(got->spec_yaml, record.spec_yaml);
  EXPECT_GE(got->status.created_unix_ms(), before);
  EXPECT_EQ(got->status.updated_unix_ms(), got->status.created_unix_ms());
}

TEST(JobStoreTest, CreateKeepsGivenTimestamps) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  JobRecord record = MakeJob("job-a", 1234);
  record.status.set_updated_unix_ms(5678);
  ASSERT_TRUE(store->CreateJob(record).ok());
  absl::StatusOr<JobRecord> got = store->GetJob("job-a");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status.created_unix_ms(), 1234);
  EXPECT_EQ(got->status.updated_unix_ms(), 5678);
}

TEST(JobStoreTest, DuplicateIdIsAlreadyExists) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-dup")).ok());
  JobRecord again = MakeJob("job-dup");
  again.spec_yaml = "other";
  absl::Status s = store->CreateJob(again);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(s.message(), HasSubstr("job-dup"));
  // The first submission is untouched.
  absl::StatusOr<JobRecord> got = store->GetJob("job-dup");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->spec_yaml, MakeJob("job-dup").spec_yaml);
}

TEST(JobStoreTest, EmptyJobIdIsInvalidArgument) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  absl::Status s = store->CreateJob(MakeJob(""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("job_id"));
}

TEST(JobStoreTest, ListJobsNewestFirstWithLimit) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-old", 1000)).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-new", 3000)).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-mid", 2000)).ok());
  // Same created_ms as job-mid: the later insert counts as newer.
  ASSERT_TRUE(store->CreateJob(MakeJob("job-mid2", 2000)).ok());

  absl::StatusOr<std::vector<v1::JobStatus>> all = store->ListJobs(0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(Ids(*all), ElementsAre("job-new", "job-mid2", "job-mid", "job-old"));
  absl::StatusOr<std::vector<v1::JobStatus>> negative = store->ListJobs(-5);
  ASSERT_TRUE(negative.ok());
  EXPECT_EQ(negative->size(), 4u);

  absl::StatusOr<std::vector<v1::JobStatus>> two = store->ListJobs(2);
  ASSERT_TRUE(two.ok());
  EXPECT_THAT(Ids(*two), ElementsAre("job-new", "job-mid2"));
  EXPECT_EQ((*two)[0].state(), v1::PENDING);
  EXPECT_EQ((*two)[0].created_unix_ms(), 3000);
}

TEST(JobStoreTest, ListJobsPagesWalkEveryJobOnceNewestFirst) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 7; ++i) {
    // Pairs share a creation time: the page boundary falls inside a pair.
    ASSERT_TRUE(store->CreateJob(MakeJob(absl::StrCat("job-", i), 1000 * (i / 2))).ok());
  }
  absl::StatusOr<std::vector<v1::JobStatus>> all = store->ListJobs(0);
  ASSERT_TRUE(all.ok()) << all.status();
  for (size_t max_bytes : {size_t{1} << 20, size_t{1}}) {
    SCOPED_TRACE(max_bytes);
    std::vector<v1::JobStatus> walked;
    std::string token;
    int pages = 0;
    do {
      auto page = store->ListJobsPage(3, token, max_bytes);
      ASSERT_TRUE(page.ok()) << page.status();
      ASSERT_FALSE(page->jobs.empty());
      EXPECT_LE(page->jobs.size(), max_bytes == 1 ? 1u : 3u);  // a tiny budget: one per page
      for (v1::JobStatus& j : page->jobs) walked.push_back(std::move(j));
      token = page->next_page_token;
      ASSERT_LT(++pages, 20);
    } while (!token.empty());
    EXPECT_EQ(pages, max_bytes == 1 ? 7 : 3);
    EXPECT_EQ(Ids(walked), Ids(*all));
  }
  for (const std::string& bad :
       std::vector<std::string>{"x", "1.2.3", "abc.def", std::string(100, '1')}) {
    auto page = store->ListJobsPage(3, bad, 1 << 20);
    ASSERT_FALSE(page.ok()) << bad;
    EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(page.status().message(), HasSubstr("page_token"));
  }
}

TEST(JobStoreTest, ListJobsOnEmptyStore) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<v1::JobStatus>> all = store->ListJobs(10);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(*all, IsEmpty());
}

// Every edge the state machine allows, walked on a real store.
TEST(JobStoreTest, EveryAllowedTransitionSucceeds) {
  const std::vector<v1::JobState> non_terminal = {v1::PENDING, v1::PROFILING,     v1::CONFIGURING,
                                                  v1::RUNNING, v1::CHECKPOINTING, v1::RECOVERING};
  // Paths from PENDING that reach each state.
  const std::vector<std::vector<v1::JobState>> path_to = {
      {},
      {v1::PROFILING},
      {v1::CONFIGURING},
      {v1::CONFIGURING, v1::RUNNING},
      {v1::CONFIGURING, v1::RUNNING, v1::CHECKPOINTING},
      {v1::CONFIGURING, v1::RUNNING, v1::RECOVERING},
  };
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  std::set<std::pair<v1::JobState, v1::JobState>> allowed_edges;
  int job = 0;
  for (size_t i = 0; i < non_terminal.size(); ++i) {
    for (int to = v1::JobState_MIN; to <= v1::JobState_MAX; ++to) {
      const v1::JobState from = non_terminal[i];
      const auto target = static_cast<v1::JobState>(to);
      if (!IsAllowedTransition(from, target)) continue;
      allowed_edges.emplace(from, target);
      const std::string id = absl::StrCat("job-", job++);
      ASSERT_TRUE(store->CreateJob(MakeJob(id)).ok());
      for (v1::JobState step : path_to[i]) {
        ASSERT_TRUE(store->Transition(id, step, "setup").ok()) << v1::JobState_Name(step);
      }
      absl::StatusOr<v1::JobStatus> moved = store->Transition(id, target, "edge");
      ASSERT_TRUE(moved.ok()) << v1::JobState_Name(from) << " -> " << v1::JobState_Name(target)
                              << ": " << moved.status();
      EXPECT_EQ(moved->state(), target);
      EXPECT_EQ(moved->reason(), "edge");
      absl::StatusOr<JobRecord> stored = store->GetJob(id);
      ASSERT_TRUE(stored.ok());
      EXPECT_EQ(stored->status.state(), target);
      EXPECT_EQ(stored->status.reason(), "edge");
    }
  }
  // Exactly the documented machine (store.h), no more.
  std::set<std::pair<v1::JobState, v1::JobState>> expected = {
      {v1::PENDING, v1::PROFILING},        {v1::PENDING, v1::CONFIGURING},
      {v1::PROFILING, v1::CONFIGURING},    {v1::PROFILING, v1::PENDING},
      {v1::CONFIGURING, v1::RUNNING},      {v1::CONFIGURING, v1::PENDING},
      {v1::RUNNING, v1::CHECKPOINTING},    {v1::RUNNING, v1::SUCCEEDED},
      {v1::RUNNING, v1::RECOVERING},       {v1::CHECKPOINTING, v1::RUNNING},
      {v1::CHECKPOINTING, v1::RECOVERING}, {v1::RECOVERING, v1::CONFIGURING},
      {v1::CONFIGURING, v1::RECOVERING},   {v1::RECOVERING, v1::PROFILING},
  };
  for (v1::JobState from : non_terminal) {
    expected.emplace(from, v1::FAILED);
    expected.emplace(from, v1::CANCELLED);
  }
  EXPECT_EQ(allowed_edges, expected);
}

TEST(JobStoreTest, AllowedTransitionTable) {
  EXPECT_TRUE(IsAllowedTransition(v1::PENDING, v1::PROFILING));
  EXPECT_TRUE(IsAllowedTransition(v1::PENDING, v1::CONFIGURING));
  EXPECT_TRUE(IsAllowedTransition(v1::PROFILING, v1::CONFIGURING));
  EXPECT_TRUE(IsAllowedTransition(v1::CONFIGURING, v1::RUNNING));
  EXPECT_TRUE(IsAllowedTransition(v1::CONFIGURING, v1::PENDING));
  EXPECT_TRUE(IsAllowedTransition(v1::RUNNING, v1::CHECKPOINTING));
  EXPECT_TRUE(IsAllowedTransition(v1::CHECKPOINTING, v1::RUNNING));
  EXPECT_TRUE(IsAllowedTransition(v1::RUNNING, v1::SUCCEEDED));
  EXPECT_TRUE(IsAllowedTransition(v1::RUNNING, v1::RECOVERING));
  EXPECT_TRUE(IsAllowedTransition(v1::RECOVERING, v1::CONFIGURING));
  EXPECT_TRUE(IsAllowedTransition(v1::CONFIGURING, v1::RECOVERING));
  EXPECT_TRUE(IsAllowedTransition(v1::RECOVERING, v1::PROFILING));
  for (v1::JobState from : {v1::PENDING, v1::PROFILING, v1::CONFIGURING, v1::RUNNING,
                            v1::CHECKPOINTING, v1::RECOVERING}) {
    EXPECT_FALSE(IsTerminal(from));
    EXPECT_TRUE(IsAllowedTransition(from, v1::FAILED)) << v1::JobState_Name(from);
    EXPECT_TRUE(IsAllowedTransition(from, v1::CANCELLED)) << v1::JobState_Name(from);
    EXPECT_FALSE(IsAllowedTransition(from, from)) << v1::JobState_Name(from);
    EXPECT_FALSE(IsAllowedTransition(from, v1::JOB_STATE_UNSPECIFIED));
  }
  for (v1::JobState terminal : {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    EXPECT_TRUE(IsTerminal(terminal));
    for (int to = v1::JobState_MIN; to <= v1::JobState_MAX; ++to) {
      EXPECT_FALSE(IsAllowedTransition(terminal, static_cast<v1::JobState>(to)));
    }
  }
  EXPECT_FALSE(IsTerminal(v1::JOB_STATE_UNSPECIFIED));
  EXPECT_FALSE(IsAllowedTransition(v1::JOB_STATE_UNSPECIFIED, v1::PENDING));
}

struct Forbidden {
  std::vector<v1::JobState> setup;  // path from PENDING
  v1::JobState to;
};

TEST(JobStoreTest, ForbiddenTransitionsFailNamingBothStates) {
  const std::vector<Forbidden> cases = {
      {{v1::CONFIGURING, v1::RUNNING, v1::SUCCEEDED}, v1::RUNNING},
      {{}, v1::SUCCEEDED},
      {{v1::CANCELLED}, v1::PENDING},
      {{}, v1::RUNNING},
      {{}, v1::CHECKPOINTING},
      {{}, v1::RECOVERING},
      {{v1::PROFILING}, v1::RUNNING},
      {{v1::CONFIGURING}, v1::SUCCEEDED},
      {{v1::CONFIGURING}, v1::CHECKPOINTING},
      {{v1::CONFIGURING, v1::RUNNING}, v1::PENDING},
      {{v1::CONFIGURING, v1::RUNNING}, v1::CONFIGURING},
      {{v1::CONFIGURING, v1::RUNNING}, v1::RUNNING},
      {{v1::CONFIGURING, v1::RUNNING, v1::CHECKPOINTING}, v1::SUCCEEDED},
      {{v1::CONFIGURING, v1::RUNNING, v1::RECOVERING}, v1::RUNNING},
      {{v1::FAILED}, v1::FAILED},
      {{v1::FAILED}, v1::CANCELLED},
      {{v1::CONFIGURING, v1::RUNNING, v1::SUCCEEDED}, v1::FAILED},
  };
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string id = absl::StrCat("job-f", i);
    ASSERT_TRUE(store->CreateJob(MakeJob(id)).ok());
    v1::JobState from = v1::PENDING;
    for (v1::JobState step : cases[i].setup) {
      ASSERT_TRUE(store->Transition(id, step, "setup").ok());
      from = step;
    }
    absl::StatusOr<v1::JobStatus> moved = store->Transition(id, cases[i].to, "nope");
    const std::string label =
        absl::StrCat(v1::JobState_Name(from), " -> ", v1::JobState_Name(cases[i].to));
    ASSERT_FALSE(moved.ok()) << label;
    EXPECT_EQ(moved.status().code(), absl::StatusCode::kFailedPrecondition) << label;
    EXPECT_THAT(moved.status().message(), HasSubstr(v1::JobState_Name(from))) << label;
    EXPECT_THAT(moved.status().message(), HasSubstr(v1::JobState_Name(cases[i].to))) << label;
    EXPECT_THAT(moved.status().message(), HasSubstr(id)) << label;
    // Nothing changed: neither the state nor the log.
    absl::StatusOr<JobRecord> stored = store->GetJob(id);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->status.state(), from) << label;
    EXPECT_NE(stored->status.reason(), "nope") << label;
    absl::StatusOr<std::vector<TransitionRecord>> log = store->Transitions(id);
    ASSERT_TRUE(log.ok());
    EXPECT_EQ(log->size(), cases[i].setup.size()) << label;
  }
}

TEST(JobStoreTest, TransitionToUnspecifiedIsInvalidArgument) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-u")).ok());
  EXPECT_EQ(store->Transition("job-u", v1::JOB_STATE_UNSPECIFIED, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Transition("job-u", static_cast<v1::JobState>(42), "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JobStoreTest, TransitionLogRecordsEachStepInOrder) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-log")).ok());
  const std::vector<std::pair<v1::JobState, std::string>> steps = {
      {v1::PROFILING, "profile blocks"},
      {v1::CONFIGURING, "plan ready"},
      {v1::RUNNING, ""},
      {v1::CHECKPOINTING, "step 100"},
      {v1::RUNNING, "checkpoint done"},
      {v1::RECOVERING, "worker w2 lost"},
      {v1::CONFIGURING, "w2 back"},
      {v1::RUNNING, "resumed"},
      {v1::SUCCEEDED, "done"},
  };
  const int64_t before = absl::ToUnixMillis(absl::Now());
  for (const auto& [to, reason] : steps) {
    absl::StatusOr<v1::JobStatus> moved = store->Transition("job-log", to, reason);
    ASSERT_TRUE(moved.ok()) << moved.status();
    EXPECT_GE(moved->updated_unix_ms(), before);
  }
  absl::StatusOr<std::vector<TransitionRecord>> log = store->Transitions("job-log");
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->size(), steps.size());
  v1::JobState from = v1::PENDING;
  int64_t last_ms = before;
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ((*log)[i].from, from) << i;
    EXPECT_EQ((*log)[i].to, steps[i].first) << i;
    EXPECT_EQ((*log)[i].reason, steps[i].second) << i;
    EXPECT_GE((*log)[i].unix_ms, last_ms) << i;
    last_ms = (*log)[i].unix_ms;
    from = steps[i].first;
  }
  absl::StatusOr<JobRecord> final_record = store->GetJob("job-log");
  ASSERT_TRUE(final_record.ok());
  EXPECT_EQ(final_record->status.state(), v1::SUCCEEDED);
  EXPECT_EQ(final_record->status.reason(), "done");
  EXPECT_EQ(final_record->status.updated_unix_ms(), log->back().unix_ms);
}

TEST(JobStoreTest, TransitionsOfNewJobIsEmpty) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-new")).ok());
  absl::StatusOr<std::vector<TransitionRecord>> log = store->Transitions("job-new");
  ASSERT_TRUE(log.ok());
  EXPECT_THAT(*log, IsEmpty());
}

TEST(JobStoreTest, UpdateStatusKeepsStateAndRejectsStateChange) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-s", 1000)).ok());
  ASSERT_TRUE(store->Transition("job-s", v1::CONFIGURING, "").ok());
  ASSERT_TRUE(store->Transition("job-s", v1::RUNNING, "started").ok());

  // No state given: the stored one is kept.
  v1::JobStatus progress;
  progress.set_job_id("job-s");
  progress.set_name("renamed");
  progress.set_step(250);
  progress.set_epoch(2);
  progress.set_train_loss(0.75);
  progress.set_samples_per_second(1234.5);
  progress.set_created_unix_ms(999999);  // ignored: creation time is fixed
  ASSERT_TRUE(store->UpdateStatus(progress).ok());
  absl::StatusOr<JobRecord> got = store->GetJob("job-s");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status.state(), v1::RUNNING);
  EXPECT_EQ(got->status.step(), 250);
  EXPECT_EQ(got->status.epoch(), 2);
  EXPECT_DOUBLE_EQ(got->status.train_loss(), 0.75);
  EXPECT_DOUBLE_EQ(got->status.samples_per_second(), 1234.5);
  EXPECT_EQ(got->status.name(), "renamed");
  EXPECT_EQ(got->status.created_unix_ms(), 1000);
  EXPECT_GT(got->status.updated_unix_ms(), 1000);

  // The same state is fine.
  progress.set_state(v1::RUNNING);
  progress.set_step(300);
  ASSERT_TRUE(store->UpdateStatus(progress).ok());

  // A different state is not, and changes nothing.
  progress.set_state(v1::SUCCEEDED);
  progress.set_step(1000);
  absl::Status s = store->UpdateStatus(progress);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("RUNNING"));
  EXPECT_THAT(s.message(), HasSubstr("SUCCEEDED"));
  got = store->GetJob("job-s");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status.state(), v1::RUNNING);
  EXPECT_EQ(got->status.step(), 300);
  // A status update is not a transition.
  absl::StatusOr<std::vector<TransitionRecord>> log = store->Transitions("job-s");
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->size(), 2u);
}

TEST(JobStoreTest, TransitionKeepsProgressFields) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-p")).ok());
  ASSERT_TRUE(store->Transition("job-p", v1::CONFIGURING, "").ok());
  ASSERT_TRUE(store->Transition("job-p", v1::RUNNING, "").ok());
  v1::JobStatus progress = store->GetJob("job-p")->status;
  progress.set_step(77);
  progress.set_eval_accuracy(0.5);
  ASSERT_TRUE(store->UpdateStatus(progress).ok());
  absl::StatusOr<v1::JobStatus> done = store->Transition("job-p", v1::FAILED, "worker crashed");
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->step(), 77);
  EXPECT_DOUBLE_EQ(done->eval_accuracy(), 0.5);
  EXPECT_EQ(done->algorithm(), "petra");
  EXPECT_EQ(done->reason(), "worker crashed");
}

TEST(JobStoreTest, MetricsAppendAndQuery) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-m")).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-other")).ok());
  ASSERT_TRUE(store
                  ->AppendMetrics("job-m", {{1, "train_loss", 2.5, 100},
                                            {1, "samples_per_second", 900, 100},
                                            {2, "train_loss", 2.0, 200}})
                  .ok());
  ASSERT_TRUE(store->AppendMetrics("job-other", {{1, "train_loss", 9.0, 100}}).ok());
  // Inserted later with a smaller step: order is insertion order.
  ASSERT_TRUE(store->AppendMetrics("job-m", {{0, "train_loss", 3.0, 0}}).ok());
  ASSERT_TRUE(store->AppendMetrics("job-m", {}).ok());

  absl::StatusOr<std::vector<MetricPoint>> all = store->Metrics("job-m");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[0].name, "train_loss");
  EXPECT_EQ((*all)[1].name, "samples_per_second");
  EXPECT_DOUBLE_EQ((*all)[1].value, 900);
  EXPECT_EQ((*all)[1].unix_ms, 100);
  EXPECT_EQ((*all)[3].step, 0);
  EXPECT_GT((*all)[3].unix_ms, 0);  // 0 means "now"

  absl::StatusOr<std::vector<MetricPoint>> loss = store->Metrics("job-m", "train_loss");
  ASSERT_TRUE(loss.ok());
  std::vector<std::tuple<int64_t, double>> seen;
  for (const MetricPoint& p : *loss) {
    EXPECT_EQ(p.name, "train_loss");
    seen.emplace_back(p.step, p.value);
  }
  EXPECT_THAT(
      seen, ElementsAre(std::make_tuple(1, 2.5), std::make_tuple(2, 2.0), std::make_tuple(0, 3.0)));

  absl::StatusOr<std::vector<MetricPoint>> none = store->Metrics("job-m", "eval_accuracy");
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(*none, IsEmpty());
  absl::StatusOr<std::vector<MetricPoint>> other = store->Metrics("job-other");
  ASSERT_TRUE(other.ok());
  ASSERT_EQ(other->size(), 1u);
  EXPECT_DOUBLE_EQ((*other)[0].value, 9.0);
}

TEST(JobStoreTest, MetricsKeepNaNAndInfinity) {
  // A diverged loss must be recorded, not rejected (SQLite turns NaN into NULL).
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-nan")).ok());
  ASSERT_TRUE(store
                  ->AppendMetrics("job-nan", {{1, "train_loss", std::nan(""), 1},
                                              {2, "train_loss", INFINITY, 2},
                                              {3, "train_loss", -0.5, 3}})
                  .ok());
  absl::StatusOr<std::vector<MetricPoint>> points = store->Metrics("job-nan", "train_loss");
  ASSERT_TRUE(points.ok());
  ASSERT_EQ(points->size(), 3u);
  EXPECT_TRUE(std::isnan((*points)[0].value));
  EXPECT_TRUE(std::isinf((*points)[1].value));
  EXPECT_DOUBLE_EQ((*points)[2].value, -0.5);
}

TEST(JobStoreTest, MetricsRejectEmptyNameAtomically) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-e")).ok());
  absl::Status s = store->AppendMetrics("job-e", {{1, "train_loss", 1, 1}, {2, "", 1, 1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("points[1].name"));
  absl::StatusOr<std::vector<MetricPoint>> points = store->Metrics("job-e");
  ASSERT_TRUE(points.ok());
  EXPECT_THAT(*points, IsEmpty());
}

TEST(JobStoreTest, WriteProgressWritesStatusesAndPointsTogether) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-a")).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-b")).ok());
  ASSERT_TRUE(store->Transition("job-b", v1::CONFIGURING, "").ok());
  EXPECT_TRUE(store->WriteProgress({}).ok());

  JobStore::ProgressBatch batch;
  v1::JobStatus a = MakeJob("job-a").status;
  a.set_state(v1::PENDING);
  a.set_reason("waiting for 2 idle workers");
  v1::JobStatus b = MakeJob("job-b").status;
  b.set_state(v1::CONFIGURING);
  b.set_step(7);
  batch.statuses = {a, b};
  batch.points = {{"job-b", {6, "train_loss", 2.0, 10}},
                  {"job-a", {0, "queue", 1.0, 11}},
                  {"job-b", {7, "train_loss", 1.5, 12}}};
  ASSERT_TRUE(store->WriteProgress(batch).ok());
  auto ga = store->GetJob("job-a");
  auto gb = store->GetJob("job-b");
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_EQ(ga->status.reason(), "waiting for 2 idle workers");
  EXPECT_EQ(ga->status.state(), v1::PENDING);
  EXPECT_EQ(gb->status.step(), 7);
  EXPECT_EQ(gb->status.state(), v1::CONFIGURING);
  auto points = store->Metrics("job-b", "train_loss");
  ASSERT_TRUE(points.ok());
  ASSERT_EQ(points->size(), 2u);
  EXPECT_EQ((*points)[0].step, 6);
  EXPECT_EQ((*points)[1].step, 7);

  // All or nothing: a state change (or an unknown job) anywhere refuses the batch.
  JobStore::ProgressBatch bad;
  v1::JobStatus moved = b;
  moved.set_state(v1::RUNNING);
  moved.set_step(99);
  bad.statuses = {moved};
  bad.points = {{"job-a", {1, "queue", 2.0, 13}}};
  absl::Status s = store->WriteProgress(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("use Transition"));
  bad.statuses.clear();
  bad.points.push_back({"job-ghost", {1, "x", 1.0, 14}});
  EXPECT_EQ(store->WriteProgress(bad).code(), absl::StatusCode::kNotFound);
  bad.points = {{"job-a", {1, "", 1.0, 15}}};
  EXPECT_EQ(store->WriteProgress(bad).code(), absl::StatusCode::kInvalidArgument);
  gb = store->GetJob("job-b");
  ASSERT_TRUE(gb.ok());
  EXPECT_EQ(gb->status.step(), 7);
  auto queue = store->Metrics("job-a", "queue");
  ASSERT_TRUE(queue.ok());
  EXPECT_EQ(queue->size(), 1u);
}

TEST(JobStoreTest, UnknownJobIsNotFound) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-real")).ok());
  const std::string ghost = "job-deadbeef";
  auto expect_not_found = [&](const absl::Status& s, const char* what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << what << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(ghost)) << what;
  };
  expect_not_found(store->GetJob(ghost).status(), "GetJob");
  expect_not_found(store->Transition(ghost, v1::CANCELLED, "").status(), "Transition");
  v1::JobStatus status;
  status.set_job_id(ghost);
  expect_not_found(store->UpdateStatus(status), "UpdateStatus");
  expect_not_found(store->Transitions(ghost).status(), "Transitions");
  expect_not_found(store->AppendMetrics(ghost, {{1, "train_loss", 1, 1}}), "AppendMetrics");
  expect_not_found(store->Metrics(ghost).status(), "Metrics");
  expect_not_found(store->Metrics(ghost, "train_loss").status(), "Metrics(name)");
  // None of it created anything.
  absl::StatusOr<std::vector<v1::JobStatus>> all = store->ListJobs(0);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(Ids(*all), ElementsAre("job-real"));
}

TEST(JobStoreTest, UnfinishedJobsOldestFirst) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-3", 3000)).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-1", 1000)).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-2", 2000)).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-4", 4000)).ok());
  ASSERT_TRUE(store->CreateJob(MakeJob("job-5", 5000)).ok());
  ASSERT_TRUE(store->Transition("job-2", v1::CANCELLED, "user").ok());
  ASSERT_TRUE(store->Transition("job-4", v1::FAILED, "oom").ok());
  ASSERT_TRUE(store->Transition("job-5", v1::CONFIGURING, "").ok());
  ASSERT_TRUE(store->Transition("job-5", v1::RUNNING, "").ok());
  ASSERT_TRUE(store->Transition("job-5", v1::SUCCEEDED, "").ok());
  ASSERT_TRUE(store->Transition("job-3", v1::CONFIGURING, "").ok());
  absl::StatusOr<std::vector<JobRecord>> unfinished = store->UnfinishedJobs();
  ASSERT_TRUE(unfinished.ok());
  EXPECT_THAT(Ids(*unfinished), ElementsAre("job-1", "job-3"));
  EXPECT_EQ((*unfinished)[1].status.state(), v1::CONFIGURING);
  EXPECT_EQ((*unfinished)[1].spec_yaml, MakeJob("job-3").spec_yaml);
}

// The "survives a coordinator restart" property.
TEST(JobStoreTest, FileDatabaseSurvivesReopen) {
  TempDir dir;
  const std::string path = dir.File("coordinator.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->CreateJob(MakeJob("job-done", 1000)).ok());
    ASSERT_TRUE(store->CreateJob(MakeJob("job-live", 2000)).ok());
    ASSERT_TRUE(store->CreateJob(MakeJob("job-queued", 3000)).ok());
    ASSERT_TRUE(store->Transition("job-done", v1::CANCELLED, "user request").ok());
    ASSERT_TRUE(store->Transition("job-live", v1::CONFIGURING, "plan").ok());
    ASSERT_TRUE(store->Transition("job-live", v1::RUNNING, "go").ok());
    v1::JobStatus progress = store->GetJob("job-live")->status;
    progress.set_step(420);
    progress.set_train_loss(1.25);
    progress.set_eval_accuracy(0.875);
    ASSERT_TRUE(store->UpdateStatus(progress).ok());
    ASSERT_TRUE(store->Transition("job-live", v1::CHECKPOINTING, "step 420").ok());
    ASSERT_TRUE(store
                    ->AppendMetrics("job-live", {{410, "train_loss", 1.5, 11},
                                                 {420, "train_loss", 1.25, 12},
                                                 {420, "eval_accuracy", 0.875, 13}})
                    .ok());
    // The file is in WAL mode with the current schema version.
    EXPECT_EQ(RawPragma(path, "PRAGMA journal_mode"), "wal");
    EXPECT_EQ(RawPragma(path, "PRAGMA user_version"), absl::StrCat(JobStore::kSchemaVersion));
  }  // "coordinator exits"

  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  absl::StatusOr<JobRecord> live = store->GetJob("job-live");
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->status.state(), v1::CHECKPOINTING);
  EXPECT_EQ(live->status.reason(), "step 420");
  EXPECT_EQ(live->status.step(), 420);
  EXPECT_DOUBLE_EQ(live->status.train_loss(), 1.25);
  EXPECT_DOUBLE_EQ(live->status.eval_accuracy(), 0.875);
  EXPECT_EQ(live->status.algorithm(), "petra");
  EXPECT_EQ(live->status.created_unix_ms(), 2000);
  EXPECT_EQ(live->spec_yaml, MakeJob("job-live").spec_yaml);

  absl::StatusOr<std::vector<TransitionRecord>> log = store->Transitions("job-live");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 3u);
  EXPECT_EQ((*log)[0].from, v1::PENDING);
  EXPECT_EQ((*log)[0].to, v1::CONFIGURING);
  EXPECT_EQ((*log)[0].reason, "plan");
  EXPECT_EQ((*log)[2].from, v1::RUNNING);
  EXPECT_EQ((*log)[2].to, v1::CHECKPOINTING);

  absl::StatusOr<std::vector<MetricPoint>> loss = store->Metrics("job-live", "train_loss");
  ASSERT_TRUE(loss.ok());
  ASSERT_EQ(loss->size(), 2u);
  EXPECT_EQ((*loss)[0].step, 410);
  EXPECT_DOUBLE_EQ((*loss)[1].value, 1.25);
  EXPECT_EQ((*loss)[1].unix_ms, 12);

  absl::StatusOr<std::vector<JobRecord>> unfinished = store->UnfinishedJobs();
  ASSERT_TRUE(unfinished.ok());
  EXPECT_THAT(Ids(*unfinished), ElementsAre("job-live", "job-queued"));
  absl::StatusOr<std::vector<v1::JobStatus>> all = store->ListJobs(0);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(Ids(*all), ElementsAre("job-queued", "job-live", "job-done"));
  EXPECT_EQ((*all)[2].state(), v1::CANCELLED);

  // And it keeps working: the restarted coordinator resumes the job.
  ASSERT_TRUE(store->Transition("job-live", v1::RUNNING, "resumed").ok());
  EXPECT_EQ(store->CreateJob(MakeJob("job-live")).code(), absl::StatusCode::kAlreadyExists);
}

TEST(JobStoreTest, OpenRejectsNewerSchema) {
  TempDir dir;
  const std::string path = dir.File("future.db");
  { ASSERT_NE(OpenOrDie(path), nullptr); }
  EXPECT_EQ(RawPragma(path, "PRAGMA user_version = 99"), "");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("99"));
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

TEST(JobStoreTest, OpenInMissingDirectoryFailsNamingPath) {
  TempDir dir;
  const std::string path = dir.File("no/such/dir/coordinator.db");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInternal) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  EXPECT_FALSE(std::filesystem::exists(dir.File("no")));
}

TEST(JobStoreTest, OpenEmptyPathIsInvalidArgument) {
  EXPECT_EQ(JobStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobStoreTest, LockedDatabaseIsUnavailable) {
  TempDir dir;
  const std::string path = dir.File("locked.db");
  JobStoreOptions options;
  options.busy_timeout = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path, options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->CreateJob(MakeJob("job-l")).ok());

  // Another process holds the write lock.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  absl::StatusOr<v1::JobStatus> moved = (*store)->Transition("job-l", v1::CANCELLED, "");
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kUnavailable) << moved.status();
  EXPECT_THAT(moved.status().message(), HasSubstr("Transition"));
  EXPECT_THAT(moved.status().message(), HasSubstr("locked"));
  // Readers are not blocked by a writer in WAL mode.
  absl::StatusOr<JobRecord> read = (*store)->GetJob("job-l");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->status.state(), v1::PENDING);
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);

  // Once the lock is gone the same call succeeds.
  ASSERT_TRUE((*store)->Transition("job-l", v1::CANCELLED, "").ok());
}

TEST(JobStoreTest, ConcurrentWritersEndWithExactCounts) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("concurrent.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob(MakeJob("job-shared")).ok());
  ASSERT_TRUE(store->Transition("job-shared", v1::CONFIGURING, "").ok());
  ASSERT_TRUE(store->Transition("job-shared", v1::RUNNING, "").ok());
  constexpr int kThreads = 4;
  constexpr int kPoints = 200;
  std::vector<std::string> own_ids(kThreads);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string name = absl::StrCat("metric_", t);
      // Each thread also runs its own job through its life.
      own_ids[t] = store->NewJobId();
      if (!store->CreateJob(MakeJob(own_ids[t])).ok()) ++failures[t];
      for (v1::JobState to : {v1::CONFIGURING, v1::RUNNING}) {
        if (!store->Transition(own_ids[t], to, name).ok()) ++failures[t];
      }
      for (int i = 0; i < kPoints; ++i) {
        if (!store->AppendMetrics("job-shared", {{i, name, i * 0.5, 1}}).ok()) ++failures[t];
        v1::JobStatus progress;
        progress.set_job_id("job-shared");
        progress.set_step(i);
        if (!store->UpdateStatus(progress).ok()) ++failures[t];
        if (i % 50 == 0) {
          if (!store->Transition(own_ids[t], v1::CHECKPOINTING, "").ok()) ++failures[t];
          if (!store->Transition(own_ids[t], v1::RUNNING, "").ok()) ++failures[t];
        }
      }
      if (!store->Transition(own_ids[t], v1::SUCCEEDED, "").ok()) ++failures[t];
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(failures, ElementsAre(0, 0, 0, 0));

  absl::StatusOr<std::vector<MetricPoint>> all = store->Metrics("job-shared");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), static_cast<size_t>(kThreads * kPoints));
  for (int t = 0; t < kThreads; ++t) {
    absl::StatusOr<std::vector<MetricPoint>> mine =
        store->Metrics("job-shared", absl::StrCat("metric_", t));
    ASSERT_TRUE(mine.ok());
    ASSERT_EQ(mine->size(), static_cast<size_t>(kPoints));
    for (int i = 0; i < kPoints; ++i) {
      EXPECT_EQ((*mine)[i].step, i);  // each thread's points in its order
      EXPECT_DOUBLE_EQ((*mine)[i].value, i * 0.5);
    }
    absl::StatusOr<std::vector<TransitionRecord>> log = store->Transitions(own_ids[t]);
    ASSERT_TRUE(log.ok());
    EXPECT_EQ(log->size(), 2u + 2u * (kPoints / 50) + 1u);
    absl::StatusOr<JobRecord> own = store->GetJob(own_ids[t]);
    ASSERT_TRUE(own.ok());
    EXPECT_EQ(own->status.state(), v1::SUCCEEDED);
  }
  absl::StatusOr<JobRecord> shared = store->GetJob("job-shared");
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->status.state(), v1::RUNNING);
  EXPECT_EQ(shared->status.step(), kPoints - 1);  // every thread ends on its last step
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = store->ListJobs(0);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), static_cast<size_t>(kThreads + 1));
}

TEST(JobStoreTest, NewJobIdFormatAndUniqueness) {
  auto store = OpenOrDie(":memory:");
  ASSERT_NE(store, nullptr);
  const std::regex format("job-[0-9a-f]{8}");
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = store->NewJobId();
    ASSERT_TRUE(std::regex_match(id, format)) << id;
    seen.insert(id);
    if (i % 100 == 0) {
      ASSERT_TRUE(store->CreateJob(MakeJob(id)).ok()) << id;
    }
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace stagewise::coordinator
