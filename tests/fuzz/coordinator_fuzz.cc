// Fuzz target: the coordinator's job manager driven by hostile clients and
// workers. Three workers are registered and connected, one job runs; the
// input is then a list of operations: events from a registered worker
// (arbitrary, or shaped after the worker's assignment with fuzzed numbers),
// events naming unknown workers, registrations, submissions, cancels,
// disconnects and acknowledgements. Invariants, checked after every
// operation: nothing crashes, and every job record stays consistent
// (step <= total, phase in range, a known state, an attempt >= 1 once placed).
#include <prometheus/registry.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/job_manager.h"
#include "coordinator/store.h"
#include "services/common/log.h"
#include "services/common/utf8.h"
#include "services/metrics/metrics.h"
#include "stagewise/v1/coordinator.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace stagewise;  // NOLINT: a test driver

class Sink : public coordinator::CommandSink {
 public:
  bool Send(const v1::Command& command) override {
    absl::MutexLock lock(&mu_);
    if (commands_.size() < 256) commands_.push_back(command);
    return true;
  }
  void Close(const absl::Status&) override {}
  std::vector<v1::Command> commands() const {
    absl::MutexLock lock(&mu_);
    return commands_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::Command> commands_ ABSL_GUARDED_BY(mu_);
};

// Reads the input front to back; past the end everything is zero.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  template <typename T>
  T Value() {
    T out{};
    const size_t n = std::min(sizeof(T), size_ - std::min(pos_, size_));
    if (n > 0) std::memcpy(&out, data_ + pos_, n);
    pos_ += n;
    return out;
  }
  // Text as gRPC delivers it: proto3 strings are UTF-8 (the parser refuses
  // anything else), so invalid sequences are made valid.
  std::string Text() { return ToValidUtf8(Bytes()); }
  std::string Bytes() {
    const size_t want = Byte();
    const size_t n = std::min(want, size_ - std::min(pos_, size_));
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

constexpr char kJob[] =
    "name: fuzz\nseed: 1\nmodel: {name: mlp, hidden: [16, 16, 8]}\n"
    "data: {dataset: synthetic, train_size: 32, test_size: 16, shape: [1, 4, 4], classes: 4}\n"
    "optimizer: {lr: 0.05}\nbatch_size: 16\nstages: 2\nsteps: 6\n";
constexpr char kPhasedJob[] =
    "name: phased\nseed: 1\nmodel: {name: mlp, hidden: [16, 16, 8]}\n"
    "data: {dataset: synthetic, train_size: 32, test_size: 16, shape: [1, 4, 4], classes: 4}\n"
    "optimizer: {lr: 0.05}\nbatch_size: 16\nstages: 2\n"
    "phases: [{algorithm: backprop, steps: 2}, {algorithm: delayed, steps: 2}]\n";

struct World {
  World() {
    auto opened = coordinator::JobStore::Open(":memory:");
    FUZZ_CHECK(opened.ok(), "store");
    store = std::move(*opened);
    metrics = std::make_unique<metrics::CoordinatorMetrics>(registry);
    coordinator::JobManagerOptions options;
    options.heartbeat_timeout = absl::Hours(1);
    options.configure_timeout = absl::Hours(1);
    options.max_live_jobs_per_owner = 4;
    manager = std::make_unique<coordinator::JobManager>(store.get(), metrics.get(), options);
    FUZZ_CHECK(manager->Start().ok(), "start");
    for (const char* id : {"w0", "w1", "w2"}) Join(id);
  }
  ~World() {
    manager->Stop();
    manager.reset();
  }
  void Join(const std::string& id) {
    v1::WorkerInfo info;
    info.set_worker_id(id);
    info.set_address(id + ".example:7000");
    info.set_protocol(v1::CONTROL_PROTOCOL_V6);
    auto r = manager->Register(info, {"worker-" + id});
    if (!r.ok()) return;
    sinks.push_back(std::make_unique<Sink>());
    if (manager->Connect(id, r->session(), sinks.back().get(), {"worker-" + id}).ok()) {
      current[id] = sinks.back().get();
    }
  }
  void Sync() { (void)manager->Cancel("job-none", ""); }
  // Every job record is consistent.
  void Check() {
    Sync();
    auto jobs = manager->ListJobs(100);
    FUZZ_CHECK(jobs.ok(), "ListJobs");
    for (const v1::JobStatus& st : *jobs) {
      FUZZ_CHECK(v1::JobState_IsValid(st.state()), "state");
      FUZZ_CHECK(st.step() >= 0, "negative step");
      FUZZ_CHECK(st.step() <= st.total_steps(), "step beyond the total");
      FUZZ_CHECK(st.phase() >= 0, "negative phase");
      FUZZ_CHECK(st.phase() < std::max(1, st.num_phases()), "phase beyond the phases");
      FUZZ_CHECK(st.attempt() >= 0, "attempt");
      FUZZ_CHECK(!st.algorithm().empty(), "algorithm lost");
      auto one = manager->GetJob(st.job_id());
      FUZZ_CHECK(one.ok() && one->state() == st.state(), "GetJob disagrees with ListJobs");
    }
  }
  // The assignments a worker was sent (its configure commands).
  std::vector<v1::Command> Configures(const std::string& id) const {
    std::vector<v1::Command> out;
    auto it = current.find(id);
    if (it == current.end()) return out;
    for (const v1::Command& c : it->second->commands()) {
      if (c.has_configure()) out.push_back(c);
    }
    return out;
  }

  prometheus::Registry registry;
  std::unique_ptr<metrics::CoordinatorMetrics> metrics;
  std::unique_ptr<coordinator::JobStore> store;
  std::vector<std::unique_ptr<Sink>> sinks;  // outlive the manager
  std::map<std::string, Sink*> current;
  std::unique_ptr<coordinator::JobManager> manager;  // destroyed first
  std::vector<std::string> jobs;
};

// An event shaped after one of `worker`'s assignments, numbers from the input.
v1::WorkerEvent Shaped(World& world, const std::string& worker, Reader& in) {
  v1::WorkerEvent e;
  e.set_worker_id(worker);
  const std::vector<v1::Command> configures = world.Configures(worker);
  v1::StageAssignment a;
  if (!configures.empty()) a = configures[in.Byte() % configures.size()].configure();
  const bool exact = (in.Byte() & 3) != 0;  // mostly the assignment's own numbers
  const int32_t stage = exact ? a.stage() : in.Value<int32_t>();
  const int32_t attempt = exact ? a.attempt() : in.Value<int32_t>();
  switch (in.Byte() % 7) {
    case 0: {
      auto* m = e.mutable_metrics();
      e.set_job_id(a.job_id());
      e.set_stage(stage);
      e.set_attempt(attempt);
      m->set_step(in.Value<int64_t>() % 16);
      (*m->mutable_values())[in.Byte() & 1 ? "train_loss" : "eval_accuracy"] = in.Value<double>();
      break;
    }
    case 1: {
      auto* p = e.mutable_phase_done();
      e.set_job_id(a.job_id());
      e.set_stage(stage);
      e.set_attempt(attempt);
      p->set_phase(in.Byte() & 1 ? in.Value<int32_t>() : in.Byte() % 3);
      break;
    }
    case 2: {
      auto* r = e.mutable_result();
      e.set_job_id(a.job_id());
      e.set_stage(stage);
      e.set_attempt(attempt);
      (*r->mutable_values())["eval_accuracy"] = in.Value<double>();
      break;
    }
    case 3: {
      auto* err = e.mutable_error();
      e.set_job_id(a.job_id());
      e.set_stage(stage);
      e.set_attempt(attempt);
      err->set_code(in.Value<int32_t>() % 20);
      err->set_retryable(in.Byte() & 1);
      err->set_message(in.Text());
      break;
    }
    case 4: {
      auto* c = e.mutable_checkpoint_saved();
      e.set_job_id(a.job_id());
      e.set_stage(stage);
      e.set_attempt(attempt);
      c->set_step(in.Value<int64_t>() % 16);
      c->set_phase(in.Byte() % 3);
      c->set_phase_step(in.Value<int64_t>() % 16);
      c->set_path(in.Text());
      break;
    }
    case 5:
      e.mutable_ack()->set_command_id(configures.empty() ? in.Value<int64_t>()
                                                         : configures.back().command_id());
      break;
    default:
      e.mutable_heartbeat();
      break;
  }
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    log::SetLogLevel(log::Level::kOff);  // lost workers and failed jobs are expected here
    return QuietProtobufLogs();
  }();
  (void)quiet;
  World world;
  Reader in(data, size);
  for (const char* yaml : {kJob, kPhasedJob}) {
    auto id = world.manager->Submit(yaml, "alice");
    FUZZ_CHECK(id.ok(), "the fixed jobs are valid");
    world.jobs.push_back(*id);
  }
  const std::vector<std::string> workers = {"w0", "w1", "w2"};
  for (int ops = 0; ops < 64 && !in.done(); ++ops) {
    const uint8_t op = in.Byte();
    const std::string& worker = workers[(op >> 4) % workers.size()];
    switch (op % 8) {
      case 0:
      case 1:
        world.manager->OnEvent(Shaped(world, worker, in));
        break;
      case 2: {  // an arbitrary event from a registered worker
        v1::WorkerEvent e;
        if (e.ParseFromString(in.Bytes())) {
          e.set_worker_id(worker);
          world.manager->OnEvent(e);
        }
        break;
      }
      case 3: {  // every configure acknowledged: the jobs start
        for (const std::string& w : workers) {
          for (const v1::Command& c : world.Configures(w)) {
            v1::WorkerEvent e;
            e.set_worker_id(w);
            e.mutable_ack()->set_command_id(c.command_id());
            world.manager->OnEvent(e);
          }
        }
        break;
      }
      case 4: {  // a client submits (a fixed job, or fuzzed text)
        const std::string yaml = in.Byte() & 1 ? std::string(kJob) : in.Text();
        auto id = world.manager->Submit(yaml, in.Byte() & 1 ? "alice" : "bob");
        if (id.ok()) world.jobs.push_back(*id);
        break;
      }
      case 5: {  // a client cancels
        const std::string id =
            world.jobs.empty() ? in.Text() : world.jobs[in.Byte() % world.jobs.size()];
        (void)world.manager->Cancel(id, in.Text());
        (void)world.manager->GetJob(id);
        (void)world.manager->ListCheckpoints(id);
        break;
      }
      case 6: {  // a worker's stream ends, and it comes back
        auto it = world.current.find(worker);
        if (it != world.current.end()) {
          world.manager->Disconnect(worker, it->second, absl::UnavailableError("fuzz"));
          world.current.erase(it);
        }
        world.Join(worker);
        break;
      }
      default: {  // a registration, maybe under a taken id
        v1::WorkerInfo info;
        if (info.ParseFromString(in.Bytes())) {
          if (in.Byte() & 1) info.set_worker_id(worker);
          (void)world.manager->Register(info, {"worker-x"});
        }
        break;
      }
    }
    world.Check();
  }
  return 0;
}
