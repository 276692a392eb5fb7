// A JobHost (coordinator/job_host.h) over a map of live jobs that records
// what the units under test asked of it: the job units' tests need no
// JobManager, no store and no loop.
#ifndef STAGEWISE_TESTS_UNIT_FAKE_JOB_HOST_H_
#define STAGEWISE_TESTS_UNIT_FAKE_JOB_HOST_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/job_host.h"
#include "coordinator/store.h"

namespace stagewise::coordinator::testing {

class FakeJobHost : public JobHost {
 public:
  struct Ended {
    std::string job_id;
    v1::JobState state;
    std::string reason;
  };

  std::map<std::string, LiveJob> jobs;
  std::vector<std::pair<std::string, v1::JobState>> transitions;
  std::vector<Ended> ended;
  std::vector<std::string> progress;  // UpdateProgress messages ("" included)
  std::vector<std::pair<std::string, std::string>> stopped;  // (job, reason)
  std::vector<std::pair<std::string, bool>> requeued;        // (job, recovering)
  std::vector<v1::JobStatus> persisted;                      // ChangeStatus
  bool fail_transitions = false;

  LiveJob* FindJob(const std::string& job_id) override {
    auto it = jobs.find(job_id);
    return it == jobs.end() ? nullptr : &it->second;
  }
  std::vector<std::string> LiveJobIds() const override {
    std::vector<std::string> ids;
    for (const auto& [id, job] : jobs) ids.push_back(id);
    return ids;
  }
  absl::StatusOr<v1::JobStatus> Transition(const std::string& job_id, v1::JobState to,
                                           const std::string& reason) override {
    if (fail_transitions) return absl::UnavailableError("the store is down");
    transitions.emplace_back(job_id, to);
    LiveJob* job = FindJob(job_id);
    if (job == nullptr) return absl::NotFoundError(job_id);
    job->status.set_state(to);
    job->status.set_reason(reason);
    return job->status;
  }
  void EndJob(std::string job_id, v1::JobState state, std::string reason) override {
    if (jobs.erase(job_id) == 0) return;
    ended.push_back({job_id, state, reason});
  }
  void UpdateProgress(LiveJob&, const std::string& message, std::vector<MetricPoint>) override {
    progress.push_back(message);
  }
  absl::Status ChangeStatus(LiveJob& job,
                            const std::function<void(v1::JobStatus&)>& change) override {
    if (fail_transitions) return absl::UnavailableError("the store is down");
    change(job.status);
    persisted.push_back(job.status);
    return absl::OkStatus();
  }
  void StopStages(const std::string& job_id, const std::string& reason) override {
    stopped.emplace_back(job_id, reason);
  }
  void Requeue(const std::string& job_id, bool recovering) override {
    requeued.emplace_back(job_id, recovering);
  }
  int64_t NewCommandId() override { return next_command++; }
  void Send(const std::string& worker_id, v1::Command command) override {
    sent.emplace_back(worker_id, std::move(command));
  }
  std::vector<std::pair<std::string, v1::Command>> sent;  // (worker, command)
  int64_t next_command = 1000;
};

}  // namespace stagewise::coordinator::testing

#endif  // STAGEWISE_TESTS_UNIT_FAKE_JOB_HOST_H_
