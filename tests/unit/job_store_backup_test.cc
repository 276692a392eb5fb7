// JobStore::Backup (an online copy while the store is written) and the
// event log's notes (Transitions with notes).
#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/job_store_fixtures.h"

namespace stagewise::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::MakeJob;
using testing::OpenOrDie;
using testing::TempDir;

TEST(JobStoreBackup, ACopyTakenWhileWritingOpensWithEveryCommittedJob) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("live.db"));
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(store->CreateJob(MakeJob(absl::StrCat("j", i))).ok());
  // Metric history makes the copy span many steps of the backup.
  JobStore::ProgressBatch batch;
  for (int i = 0; i < 20000; ++i) {
    batch.points.emplace_back("j0", MetricPoint{i, "train_loss", 1.0 / (i + 1), 0});
  }
  ASSERT_TRUE(store->WriteProgress(batch).ok());
  // A writer keeps going while the copy is made.
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      JobStore::ProgressBatch more;
      more.points.emplace_back("j1", MetricPoint{i, "train_loss", 0.5, 0});
      ASSERT_TRUE(store->WriteProgress(more).ok());
    }
  });
  const absl::Status copied = store->Backup(dir.File("copy.db"));
  stop = true;
  writer.join();
  ASSERT_TRUE(copied.ok()) << copied;

  auto copy = OpenOrDie(dir.File("copy.db"));
  ASSERT_NE(copy, nullptr);
  auto jobs = copy->ListJobs(0);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 20u);
  auto points = copy->Metrics("j0");
  ASSERT_TRUE(points.ok());
  EXPECT_EQ(points->size(), 20000u);

  // Never over an existing file; nothing left behind on failure.
  EXPECT_EQ(store->Backup(dir.File("copy.db")).code(), absl::StatusCode::kAlreadyExists);
  const std::string nowhere = dir.File("no/such/dir/copy.db");
  EXPECT_FALSE(store->Backup(nowhere).ok());
  EXPECT_FALSE(std::filesystem::exists(nowhere));
}

TEST(JobStoreNotes, NotesJoinTheLogInTimeOrderButNotTheTransitions) {
  auto store = OpenOrDie(":memory:");
  ASSERT_TRUE(store->CreateJob(MakeJob("j")).ok());
  ASSERT_TRUE(store->Transition("j", v1::PROFILING, "").ok());
  JobStore::ProgressBatch batch;
  // Written later than the transition that follows, but it happened before.
  batch.notes.emplace_back("j", TransitionRecord{v1::PROFILING, v1::PROFILING, "planned", 1});
  ASSERT_TRUE(store->Transition("j", v1::CONFIGURING, "").ok());
  ASSERT_TRUE(store->WriteProgress(batch).ok());
  auto log = store->Transitions("j", /*notes=*/true);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->size(), 3u);
  EXPECT_EQ((*log)[0].reason, "planned");
  EXPECT_EQ((*log)[0].from, (*log)[0].to);
  auto transitions = store->Transitions("j");
  ASSERT_TRUE(transitions.ok());
  EXPECT_EQ(transitions->size(), 2u);

  JobStore::ProgressBatch moving;
  moving.notes.emplace_back("j", TransitionRecord{v1::RUNNING, v1::FAILED, "no", 0});
  EXPECT_THAT(store->WriteProgress(moving).message(), HasSubstr("notes[0]"));
  JobStore::ProgressBatch unknown;
  unknown.notes.emplace_back("nope", TransitionRecord{v1::RUNNING, v1::RUNNING, "x", 0});
  EXPECT_EQ(store->WriteProgress(unknown).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace stagewise::coordinator
