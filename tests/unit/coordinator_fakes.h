// Fakes for the coordinator's unit tests: a CommandSink that records what
// the coordinator sends, and small builders of worker messages.
#ifndef STAGEWISE_TESTS_UNIT_COORDINATOR_FAKES_H_
#define STAGEWISE_TESTS_UNIT_COORDINATOR_FAKES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/worker_registry.h"
#include "services/planner/profile.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator::testing {

class FakeSink : public CommandSink {
 public:
  bool Send(const v1::Command& command) override {
    absl::MutexLock lock(&mu_);
    commands_.push_back(command);
    return !closed_;
  }
  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    close_status_ = status;
  }
  std::vector<v1::Command> commands() const {
    absl::MutexLock lock(&mu_);
    return commands_;
  }
  // The commands of one kind (Command::kConfigure, kStart, kStop, kProfile).
  std::vector<v1::Command> Of(v1::Command::CommandCase kind) const {
    std::vector<v1::Command> out;
    for (const v1::Command& c : commands()) {
      if (c.command_case() == kind) out.push_back(c);
    }
    return out;
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }
  absl::Status close_status() const {
    absl::MutexLock lock(&mu_);
    return close_status_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::Command> commands_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
};

inline v1::WorkerInfo Info(const std::string& id, int64_t memory_bytes = 0) {
  v1::WorkerInfo info;
  info.set_worker_id(id);
  info.set_address(id + ".example:7000");
  info.set_memory_bytes(memory_bytes);
  info.set_protocol(v1::CONTROL_PROTOCOL_V6);
  return info;
}

// A small MLP job with `stages` stages (2 steps per epoch at batch 16).
inline std::string JobYaml(int stages, int steps, const std::string& extra = "") {
  return "name: small\nseed: 1\nmodel: {name: mlp, hidden: [32, 32, 16]}\n"
         "data: {dataset: synthetic, train_size: 32, test_size: 16, shape: [1, 8, 8], "
         "classes: 4}\n"
         "optimizer: {lr: 0.05}\nbatch_size: 16\nstages: " +
         std::to_string(stages) + "\n" +
         (steps > 0 ? "steps: " + std::to_string(steps) + "\n" : "") + extra;
}

inline v1::WorkerEvent AckEvent(const std::string& worker, int64_t command_id) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.mutable_ack()->set_command_id(command_id);
  return e;
}

inline v1::WorkerEvent HeartbeatEvent(const std::string& worker) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.mutable_heartbeat()->set_unix_ms(1);
  return e;
}

inline v1::WorkerEvent MetricsEvent(const std::string& worker, const std::string& job, int stage,
                                    int64_t step, double train_loss) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.set_job_id(job);
  e.set_stage(stage);
  v1::MetricsReport* m = e.mutable_metrics();
  m->set_step(step);
  (*m->mutable_values())["train_loss"] = train_loss;
  return e;
}

inline v1::WorkerEvent ResultEvent(const std::string& worker, const std::string& job, int stage,
                                   double eval_accuracy) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.set_job_id(job);
  e.set_stage(stage);
  v1::StageResult* r = e.mutable_result();
  (*r->mutable_values())["eval_accuracy"] = eval_accuracy;
  return e;
}

inline v1::WorkerEvent PhaseDoneEvent(const std::string& worker, const std::string& job, int stage,
                                      int phase) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.set_job_id(job);
  e.set_stage(stage);
  v1::PhaseDone* d = e.mutable_phase_done();
  d->set_phase(phase);
  return e;
}

inline v1::WorkerEvent ErrorEvent(const std::string& worker, const std::string& job, int stage,
                                  const std::string& message) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.set_job_id(job);
  e.set_stage(stage);
  v1::StageError* err = e.mutable_error();
  err->set_code(static_cast<int>(absl::StatusCode::kInternal));
  err->set_message(message);
  return e;
}

inline v1::WorkerEvent ProfileEvent(const std::string& worker, const std::string& job,
                                    const v1::ModelProfile& profile = {}) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  e.set_job_id(job);
  e.set_stage(-1);
  *e.mutable_profile()->mutable_profile() = profile;
  return e;
}

// A profile of `n` equal blocks (10 ms forward, 20 ms backward, 1 KiB
// activations).
inline planner::ModelProfile EqualBlocks(size_t n) {
  planner::ModelProfile p;
  p.key = "k";
  p.model = "mlp";
  p.batch_size = 16;
  p.device = "cpu";
  p.threads = 1;
  p.repeats = 1;
  for (size_t i = 0; i < n; ++i) {
    planner::BlockProfile b;
    b.index = static_cast<int>(i);
    b.kind = "linear";
    b.forward_s = b.forward_nograd_s = 0.01;
    b.backward_s = 0.02;
    b.input_bytes = b.output_bytes = 1024;
    p.blocks.push_back(b);
  }
  return p;
}

}  // namespace stagewise::coordinator::testing

#endif  // STAGEWISE_TESTS_UNIT_COORDINATOR_FAKES_H_
