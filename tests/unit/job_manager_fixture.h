// The JobManager unit tests' fixture: an in-memory JobStore, fake control
// streams that record commands, no gRPC and no real workers. The manager
// handles events on its own thread; Sync() waits until it has handled
// everything sent before.
#ifndef STAGEWISE_TESTS_UNIT_JOB_MANAGER_FIXTURE_H_
#define STAGEWISE_TESTS_UNIT_JOB_MANAGER_FIXTURE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/job_manager.h"
#include "services/checkpoint/checkpoint.h"
#include "services/metrics/metrics.h"
#include "tests/unit/coordinator_fakes.h"

namespace stagewise::coordinator::testing {

// Writes stage `stage`'s shard of step `step` under checkpoint dir `root`
// and returns the CheckpointSaved event `worker` sends for it.
inline v1::WorkerEvent SavedShard(const std::string& root, const std::string& job,
                                  const std::string& worker, int stage, int64_t step,
                                  int attempt = 0) {
  const std::string dir = checkpoint::StepDir(root, job, step);
  const std::string data = "shard " + std::to_string(stage) + " at " + std::to_string(step);
  EXPECT_TRUE(
      checkpoint::WriteFileAtomically(dir + "/" + checkpoint::ShardFileName(stage), data).ok());
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.set_job_id(job);
  e.set_stage(stage);
  e.set_attempt(attempt);
  v1::CheckpointSaved* c = e.mutable_checkpoint_saved();
  c->set_step(step);
  c->set_phase_step(step);
  c->set_path(dir + "/" + checkpoint::ShardFileName(stage));
  c->set_bytes(static_cast<int64_t>(data.size()));
  c->set_crc32(checkpoint::Crc32(data));
  return e;
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = JobStore::Open(":memory:");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    metrics_ = std::make_unique<metrics::CoordinatorMetrics>(registry_);
  }
  void TearDown() override { manager_.reset(); }

  static JobManagerOptions Options() {
    JobManagerOptions o;
    o.heartbeat_timeout = absl::Hours(1);      // no expiry unless a test asks for it
    o.recovery_settle = absl::ZeroDuration();  // placed again at once unless a test asks
    return o;
  }
  void StartManager(JobManagerOptions options = Options()) {
    manager_ = std::make_unique<JobManager>(store_.get(), metrics_.get(), options);
    ASSERT_TRUE(manager_->Start().ok());
  }
  // Registers and connects a worker through a fake stream.
  FakeSink* AddWorker(const std::string& id) {
    auto r = manager_->Register(Info(id));
    EXPECT_TRUE(r.ok()) << r.status();
    auto sink = std::make_unique<FakeSink>();
    EXPECT_TRUE(manager_->Connect(id, r.ok() ? r->session() : "", sink.get()).ok());
    sinks_[id] = std::move(sink);
    return sinks_[id].get();
  }
  FakeSink& Sink(const std::string& id) { return *sinks_.at(id); }
  // Every task queued before this call has run (Cancel waits for the loop).
  void Sync() { (void)manager_->Cancel("job-none", ""); }
  v1::JobStatus Status(const std::string& id) {
    auto st = manager_->GetJob(id);
    EXPECT_TRUE(st.ok()) << st.status();
    return st.ok() ? *st : v1::JobStatus();
  }
  std::string Submit(const std::string& yaml) {
    auto id = manager_->Submit(yaml);
    EXPECT_TRUE(id.ok()) << id.status();
    Sync();
    return id.ok() ? *id : "";
  }
  // Acks every configure command the workers got; the job then runs.
  void AckAll(const std::vector<std::string>& workers) {
    for (const std::string& w : workers) {
      for (const v1::Command& c : Sink(w).Of(v1::Command::kConfigure)) {
        manager_->OnEvent(AckEvent(w, c.command_id()));
      }
    }
    Sync();
  }
  std::vector<v1::JobState> Transitions(const std::string& id) {
    std::vector<v1::JobState> out;
    auto ts = store_->Transitions(id);
    EXPECT_TRUE(ts.ok()) << ts.status();
    if (ts.ok()) {
      for (const TransitionRecord& t : *ts) out.push_back(t.to);
    }
    return out;
  }
  absl::StatusOr<double> Gauge(const std::string& name, const std::string& job) {
    return metrics::FindSample(metrics::TextExposition(registry_), name, {{"job", job}});
  }

  prometheus::Registry registry_;
  std::unique_ptr<metrics::CoordinatorMetrics> metrics_;
  std::unique_ptr<JobStore> store_;
  std::map<std::string, std::unique_ptr<FakeSink>> sinks_;
  std::unique_ptr<JobManager> manager_;  // destroyed first: it may still use the sinks
};

}  // namespace stagewise::coordinator::testing

#endif  // STAGEWISE_TESTS_UNIT_JOB_MANAGER_FIXTURE_H_
