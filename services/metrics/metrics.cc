// MetricsServer, StageMetrics and CoordinatorMetrics on prometheus-cpp.
//
// Families are built once per registry and shared through a process-wide
// cache keyed by Registry*. Cache entries are reference counted by the
// StageMetrics/CoordinatorMetrics objects using them; when the last one goes
// the families are removed from the registry, so a later registry at the same
// address never sees stale pointers and a registry that throws on duplicate
// names can be reused.
#include "services/metrics/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace stagewise::metrics {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;
using prometheus::Registry;

// Exponential buckets for compute seconds: 100 us * 2^k up to ~26 s.
Histogram::BucketBoundaries ComputeBuckets() {
  Histogram::BucketBoundaries buckets;
  for (double b = 1e-4; b < 30.0; b *= 2.0) buckets.push_back(b);
  return buckets;
}

const Histogram::BucketBoundaries& ComputeBucketsOnce() {
  static const auto* const kBuckets = new Histogram::BucketBoundaries(ComputeBuckets());
  return *kBuckets;
}

// One Shared (a group of families plus its series) per registry, reference
// counted. Shared must have a constructor from Registry& and
// Unregister(Registry&).
template <typename Shared>
class RegistryCache {
 public:
  Shared& Acquire(Registry& registry) {
    absl::MutexLock lock(&mu_);
    Entry& entry = entries_[&registry];
    if (entry.shared == nullptr) {
      try {
        entry.shared = std::make_unique<Shared>(registry);
      } catch (...) {
        entries_.erase(&registry);
        throw;
      }
    }
    ++entry.refs;
    return *entry.shared;
  }

  void Release(Registry& registry) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(&registry);
    if (it == entries_.end()) return;
    if (--it->second.refs == 0) {
      it->second.shared->Unregister(registry);
      entries_.erase(it);
    }
  }

 private:
  struct Entry {
    std::unique_ptr<Shared> shared;
    int refs = 0;
  };
  absl::Mutex mu_;
  std::map<Registry*, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// Looks a child up by key under a reader lock; creates it under the writer
// lock on first use.
template <typename T, typename Make>
T* LookupOrAdd(absl::Mutex& mu, std::map<std::string, T*, std::less<>>& children,
               absl::string_view key, Make make) {
  {
    absl::ReaderMutexLock lock(&mu);
    auto it = children.find(key);
    if (it != children.end()) return it->second;
  }
  absl::MutexLock lock(&mu);
  auto it = children.find(key);
  if (it != children.end()) return it->second;
  T* child = make();
  children.emplace(std::string(key), child);
  return child;
}

Labels With(Labels labels, const std::string& key, const std::string& value) {
  labels[key] = value;
  return labels;
}

// ---------------------------------------------------------------- stage ----

// The series of one (job, stage, algorithm).
struct StageSeries {
  Labels base;
  int refs = 0;
  Counter* idle = nullptr;
  Gauge* inbox = nullptr;
  Counter* bytes_sent = nullptr;
  Counter* bytes_received = nullptr;
  Counter* messages_sent = nullptr;
  Counter* messages_received = nullptr;
  Gauge* staleness = nullptr;
  Counter* steps = nullptr;
  absl::Mutex mu;
  std::map<std::string, Histogram*, std::less<>> compute;  // by phase
  std::map<std::string, Gauge*, std::less<>> memory;       // by kind
  std::map<std::string, Gauge*, std::less<>> message;      // by message kind
  std::map<std::string, Gauge*, std::less<>> value;        // algorithm values by name
};

class StageFamilies {
 public:
  explicit StageFamilies(Registry& registry)
      : compute_(prometheus::BuildHistogram()
                     .Name("stagewise_stage_compute_seconds")
                     .Help("Seconds a stage spends computing one unit of work, by phase "
                           "(forward, backward, recompute, step, eval).")
                     .Register(registry)),
        idle_(prometheus::BuildCounter()
                  .Name("stagewise_stage_idle_seconds_total")
                  .Help("Seconds the stage compute thread spent waiting for a message.")
                  .Register(registry)),
        inbox_(prometheus::BuildGauge()
                   .Name("stagewise_stage_inbox_depth")
                   .Help("Messages queued in the stage inbox.")
                   .Register(registry)),
        bytes_(prometheus::BuildCounter()
                   .Name("stagewise_transport_bytes_total")
                   .Help("Payload bytes moved by the stage transport, by direction (sent, "
                         "received).")
                   .Register(registry)),
        messages_(prometheus::BuildCounter()
                      .Name("stagewise_transport_messages_total")
                      .Help("Messages moved by the stage transport, by direction (sent, "
                            "received).")
                      .Register(registry)),
        staleness_(prometheus::BuildGauge()
                       .Name("stagewise_stage_staleness_steps")
                       .Help("Optimizer steps between a sample's forward and its backward.")
                       .Register(registry)),
        memory_(prometheus::BuildGauge()
                    .Name("stagewise_stage_memory_bytes")
                    .Help("Bytes the stage holds, by kind (inputs, activations, parameters, "
                          "gradients).")
                    .Register(registry)),
        steps_(prometheus::BuildCounter()
                   .Name("stagewise_stage_steps_total")
                   .Help("Optimizer steps taken by the stage.")
                   .Register(registry)),
        value_(prometheus::BuildGauge()
                   .Name("stagewise_stage_algorithm_value")
                   .Help("Algorithm-specific quantities by name (auxnet: constraint_violation, "
                         "penalty_loss, local_loss, serial_loss).")
                   .Register(registry)),
        message_(prometheus::BuildGauge()
                     .Name("stagewise_stage_message_bytes")
                     .Help("Size of the last message the stage sent, by message kind (forward, "
                           "backward, eval).")
                     .Register(registry)) {}

  void Unregister(Registry& registry) {
    registry.Remove(compute_);
    registry.Remove(idle_);
    registry.Remove(inbox_);
    registry.Remove(bytes_);
    registry.Remove(messages_);
    registry.Remove(staleness_);
    registry.Remove(memory_);
    registry.Remove(steps_);
    registry.Remove(message_);
    registry.Remove(value_);
  }

  StageSeries* AcquireSeries(const Labels& base) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<StageSeries>& slot = series_[base];
    if (slot == nullptr) {
      auto series = std::make_unique<StageSeries>();
      series->base = base;
      series->idle = &idle_.Add(base);
      series->inbox = &inbox_.Add(base);
      series->bytes_sent = &bytes_.Add(With(base, "direction", "sent"));
      series->bytes_received = &bytes_.Add(With(base, "direction", "received"));
      series->messages_sent = &messages_.Add(With(base, "direction", "sent"));
      series->messages_received = &messages_.Add(With(base, "direction", "received"));
      series->staleness = &staleness_.Add(base);
      series->steps = &steps_.Add(base);
      slot = std::move(series);
    }
    ++slot->refs;
    return slot.get();
  }

  void ReleaseSeries(StageSeries* series) {
    absl::MutexLock lock(&mu_);
    auto it = series_.find(series->base);
    if (it == series_.end() || --it->second->refs > 0) return;
    idle_.Remove(series->idle);
    inbox_.Remove(series->inbox);
    bytes_.Remove(series->bytes_sent);
    bytes_.Remove(series->bytes_received);
    messages_.Remove(series->messages_sent);
    messages_.Remove(series->messages_received);
    staleness_.Remove(series->staleness);
    steps_.Remove(series->steps);
    {
      absl::MutexLock series_lock(&series->mu);
      for (const auto& [phase, histogram] : series->compute) compute_.Remove(histogram);
      for (const auto& [kind, gauge] : series->memory) memory_.Remove(gauge);
      for (const auto& [kind, gauge] : series->message) message_.Remove(gauge);
      for (const auto& [name, gauge] : series->value) value_.Remove(gauge);
    }
    series_.erase(it);
  }

  Histogram* Compute(StageSeries& series, absl::string_view phase) {
    return LookupOrAdd(series.mu, series.compute, phase, [&] {
      return &compute_.Add(With(series.base, "phase", std::string(phase)), ComputeBucketsOnce());
    });
  }

  Gauge* Memory(StageSeries& series, absl::string_view kind) {
    return LookupOrAdd(series.mu, series.memory, kind,
                       [&] { return &memory_.Add(With(series.base, "kind", std::string(kind))); });
  }

  Gauge* Value(StageSeries& series, absl::string_view name) {
    return LookupOrAdd(series.mu, series.value, name,
                       [&] { return &value_.Add(With(series.base, "name", std::string(name))); });
  }

  Gauge* Message(StageSeries& series, absl::string_view kind) {
    return LookupOrAdd(series.mu, series.message, kind,
                       [&] { return &message_.Add(With(series.base, "kind", std::string(kind))); });
  }

 private:
  Family<Histogram>& compute_;
  Family<Counter>& idle_;
  Family<Gauge>& inbox_;
  Family<Counter>& bytes_;
  Family<Counter>& messages_;
  Family<Gauge>& staleness_;
  Family<Gauge>& memory_;
  Family<Counter>& steps_;
  Family<Gauge>& value_;
  Family<Gauge>& message_;
  absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<StageSeries>> series_ ABSL_GUARDED_BY(mu_);
};

RegistryCache<StageFamilies>& StageCache() {
  static auto* const cache = new RegistryCache<StageFamilies>();
  return *cache;
}

// ---------------------------------------------------------- coordinator ----

class CoordinatorFamilies {
 public:
  explicit CoordinatorFamilies(Registry& registry)
      : train_loss_(prometheus::BuildGauge()
                        .Name("stagewise_job_train_loss")
                        .Help("Latest training loss of a job.")
                        .Register(registry)),
        eval_loss_(prometheus::BuildGauge()
                       .Name("stagewise_job_eval_loss")
                       .Help("Latest evaluation loss of a job.")
                       .Register(registry)),
        eval_accuracy_(prometheus::BuildGauge()
                           .Name("stagewise_job_eval_accuracy")
                           .Help("Latest evaluation accuracy of a job (0..1).")
                           .Register(registry)),
        samples_per_second_(prometheus::BuildGauge()
                                .Name("stagewise_job_samples_per_second")
                                .Help("Training throughput of a job in samples per second.")
                                .Register(registry)),
        tokens_per_second_(prometheus::BuildGauge()
                               .Name("stagewise_job_tokens_per_second")
                               .Help("Training throughput of a text job in bytes predicted per "
                                     "second.")
                               .Register(registry)),
        eval_bits_per_byte_(prometheus::BuildGauge()
                                .Name("stagewise_job_eval_bits_per_byte")
                                .Help("Latest evaluation loss of a text job in bits per byte.")
                                .Register(registry)),
        step_(prometheus::BuildGauge()
                  .Name("stagewise_job_step")
                  .Help("Latest optimizer step of a job.")
                  .Register(registry)),
        jobs_(prometheus::BuildGauge()
                  .Name("stagewise_coordinator_jobs")
                  .Help("Jobs known to the coordinator, by state.")
                  .Register(registry)),
        workers_(prometheus::BuildGauge()
                     .Name("stagewise_coordinator_workers")
                     .Help("Registered workers, by state (idle, busy).")
                     .Register(registry)),
        worker_seconds_(prometheus::BuildGauge()
                            .Name("stagewise_coordinator_worker_seconds")
                            .Help("Worker-seconds since the coordinator started, by use "
                                  "(productive, bubble, startup, checkpoint, recovery, "
                                  "idle_waiting, idle_unqueued; docs/operations.md).")
                            .Register(registry)),
        goodput_(prometheus::BuildGauge()
                     .Name("stagewise_coordinator_goodput_ratio")
                     .Help("Worker-seconds in training steps (productive and bubble) over "
                           "registered ones less the idle time with nothing queued, since "
                           "the coordinator started.")
                     .Register(registry)),
        transitions_(prometheus::BuildCounter()
                         .Name("stagewise_coordinator_job_transitions_total")
                         .Help("Job state transitions, by target state.")
                         .Register(registry)),
        restarts_(prometheus::BuildCounter()
                      .Name("stagewise_coordinator_job_restarts_total")
                      .Help("Attempts of jobs that ended early and were recovered, by cause "
                            "(worker_lost, stage_error, coordinator_restart, configure_timeout, "
                            "corrupt_checkpoint).")
                      .Register(registry)),
        steps_redone_family_(prometheus::BuildCounter()
                                 .Name("stagewise_coordinator_steps_redone_total")
                                 .Help("Optimizer steps that recoveries had to train again "
                                       "(reached before the failure, after the checkpoint "
                                       "resumed from).")
                                 .Register(registry)),
        checkpoints_family_(prometheus::BuildCounter()
                                .Name("stagewise_coordinator_checkpoints_committed_total")
                                .Help("Checkpoints committed (every shard durable, manifest "
                                      "written).")
                                .Register(registry)),
        recovery_family_(prometheus::BuildHistogram()
                             .Name("stagewise_coordinator_recovery_seconds")
                             .Help("From the end of an attempt to its successor running again.")
                             .Register(registry)),
        refused_(prometheus::BuildCounter()
                     .Name("stagewise_coordinator_refused_total")
                     .Help("Requests and worker events the coordinator refused or ignored, by "
                           "reason (unauthenticated, permission_denied, not_assigned, "
                           "wrong_stage, out_of_range, bad_session, ...).")
                     .Register(registry)),
        steps_redone_(steps_redone_family_.Add({})),
        checkpoints_(checkpoints_family_.Add({})),
        recovery_seconds_(recovery_family_.Add(
            {}, Histogram::BucketBoundaries{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600})) {}

  void CountRestart(const std::string& cause) {
    absl::MutexLock lock(&mu_);
    Counter*& counter = restarts_by_cause_[cause];
    if (counter == nullptr) counter = &restarts_.Add({{"cause", cause}});
    counter->Increment();
  }
  void CountRefused(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    Counter*& counter = refused_by_reason_[reason];
    if (counter == nullptr) counter = &refused_.Add({{"reason", reason}});
    counter->Increment();
  }
  void AddStepsRedone(int64_t steps) { steps_redone_.Increment(static_cast<double>(steps)); }
  void CountCheckpoint() { checkpoints_.Increment(); }
  void ObserveRecovery(double seconds) { recovery_seconds_.Observe(seconds); }

  void Unregister(Registry& registry) {
    registry.Remove(train_loss_);
    registry.Remove(eval_loss_);
    registry.Remove(eval_accuracy_);
    registry.Remove(samples_per_second_);
    registry.Remove(tokens_per_second_);
    registry.Remove(eval_bits_per_byte_);
    registry.Remove(step_);
    registry.Remove(jobs_);
    registry.Remove(workers_);
    registry.Remove(worker_seconds_);
    registry.Remove(goodput_);
    registry.Remove(transitions_);
    registry.Remove(restarts_);
    registry.Remove(steps_redone_family_);
    registry.Remove(checkpoints_family_);
    registry.Remove(recovery_family_);
    registry.Remove(refused_);
  }

  void SetJobProgress(const std::string& job, int64_t step, double train_loss,
                      double samples_per_second) {
    absl::MutexLock lock(&mu_);
    JobGauges& gauges = job_gauges_[job];
    Get(step_, job, gauges.step)->Set(static_cast<double>(step));
    Get(train_loss_, job, gauges.train_loss)->Set(train_loss);
    Get(samples_per_second_, job, gauges.samples_per_second)->Set(samples_per_second);
  }

  void SetJobEval(const std::string& job, double loss, double accuracy) {
    absl::MutexLock lock(&mu_);
    JobGauges& gauges = job_gauges_[job];
    Get(eval_loss_, job, gauges.eval_loss)->Set(loss);
    Get(eval_accuracy_, job, gauges.eval_accuracy)->Set(accuracy);
  }

  void SetJobText(const std::string& job, double tokens_per_second, double eval_bits_per_byte) {
    absl::MutexLock lock(&mu_);
    JobGauges& gauges = job_gauges_[job];
    Get(tokens_per_second_, job, gauges.tokens_per_second)->Set(tokens_per_second);
    if (eval_bits_per_byte >= 0) {
      Get(eval_bits_per_byte_, job, gauges.eval_bits_per_byte)->Set(eval_bits_per_byte);
    }
  }

  void RemoveJob(const std::string& job) {
    absl::MutexLock lock(&mu_);
    auto it = job_gauges_.find(job);
    if (it == job_gauges_.end()) return;
    const JobGauges& gauges = it->second;
    if (gauges.train_loss != nullptr) train_loss_.Remove(gauges.train_loss);
    if (gauges.eval_loss != nullptr) eval_loss_.Remove(gauges.eval_loss);
    if (gauges.eval_accuracy != nullptr) eval_accuracy_.Remove(gauges.eval_accuracy);
    if (gauges.samples_per_second != nullptr) {
      samples_per_second_.Remove(gauges.samples_per_second);
    }
    if (gauges.step != nullptr) step_.Remove(gauges.step);
    if (gauges.tokens_per_second != nullptr) tokens_per_second_.Remove(gauges.tokens_per_second);
    if (gauges.eval_bits_per_byte != nullptr) {
      eval_bits_per_byte_.Remove(gauges.eval_bits_per_byte);
    }
    job_gauges_.erase(it);
  }

  void SetJobsInState(const std::string& state, int64_t count) {
    absl::MutexLock lock(&mu_);
    Gauge*& gauge = jobs_by_state_[state];
    if (gauge == nullptr) gauge = &jobs_.Add({{"state", state}});
    gauge->Set(static_cast<double>(count));
  }

  void SetWorkers(int64_t idle, int64_t busy) {
    absl::MutexLock lock(&mu_);
    if (workers_idle_ == nullptr) workers_idle_ = &workers_.Add({{"state", "idle"}});
    if (workers_busy_ == nullptr) workers_busy_ = &workers_.Add({{"state", "busy"}});
    workers_idle_->Set(static_cast<double>(idle));
    workers_busy_->Set(static_cast<double>(busy));
  }

  void SetGoodput(const std::map<std::string, double>& by_use, double ratio) {
    absl::MutexLock lock(&mu_);
    for (const auto& [use, seconds] : by_use) {
      Gauge*& gauge = worker_seconds_by_use_[use];
      if (gauge == nullptr) gauge = &worker_seconds_.Add({{"use", use}});
      gauge->Set(seconds);
    }
    if (goodput_ratio_ == nullptr) goodput_ratio_ = &goodput_.Add({});
    goodput_ratio_->Set(ratio);
  }

  void CountTransition(const std::string& to_state) {
    absl::MutexLock lock(&mu_);
    Counter*& counter = transitions_by_state_[to_state];
    if (counter == nullptr) counter = &transitions_.Add({{"to", to_state}});
    counter->Increment();
  }

 private:
  struct JobGauges {
    Gauge* train_loss = nullptr;
    Gauge* eval_loss = nullptr;
    Gauge* eval_accuracy = nullptr;
    Gauge* samples_per_second = nullptr;
    Gauge* step = nullptr;
    Gauge* tokens_per_second = nullptr;
    Gauge* eval_bits_per_byte = nullptr;
  };

  static Gauge* Get(Family<Gauge>& family, const std::string& job, Gauge*& slot) {
    if (slot == nullptr) slot = &family.Add({{"job", job}});
    return slot;
  }

  Family<Gauge>& train_loss_;
  Family<Gauge>& eval_loss_;
  Family<Gauge>& eval_accuracy_;
  Family<Gauge>& samples_per_second_;
  Family<Gauge>& tokens_per_second_;
  Family<Gauge>& eval_bits_per_byte_;
  Family<Gauge>& step_;
  Family<Gauge>& jobs_;
  Family<Gauge>& workers_;
  Family<Gauge>& worker_seconds_;
  Family<Gauge>& goodput_;
  Family<Counter>& transitions_;
  Family<Counter>& restarts_;
  Family<Counter>& steps_redone_family_;
  Family<Counter>& checkpoints_family_;
  Family<Histogram>& recovery_family_;
  Family<Counter>& refused_;
  Counter& steps_redone_;
  Counter& checkpoints_;
  Histogram& recovery_seconds_;
  absl::Mutex mu_;
  std::map<std::string, Counter*> restarts_by_cause_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counter*> refused_by_reason_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobGauges> job_gauges_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Gauge*> jobs_by_state_ ABSL_GUARDED_BY(mu_);
  Gauge* workers_idle_ ABSL_GUARDED_BY(mu_) = nullptr;
  Gauge* workers_busy_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, Gauge*> worker_seconds_by_use_ ABSL_GUARDED_BY(mu_);
  Gauge* goodput_ratio_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, Counter*> transitions_by_state_ ABSL_GUARDED_BY(mu_);
};

RegistryCache<CoordinatorFamilies>& CoordinatorCache() {
  static auto* const cache = new RegistryCache<CoordinatorFamilies>();
  return *cache;
}

}  // namespace

// -------------------------------------------------------- MetricsServer ----

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& bind_address) {
  auto server = absl::WrapUnique(new MetricsServer());
  try {
    server->registry_ = std::make_shared<Registry>();
    if (bind_address.empty()) return server;
    // civetweb's own bounds on a request before it is answered: its head at
    // most 16 KiB, the whole request within 10 s (a slow client cannot keep
    // a thread), one request per connection (docs/security.md).
    server->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", bind_address, "num_threads", "2", "max_request_size", "16384",
        "request_timeout_ms", "10000", "enable_keep_alive", "no"});
    server->exposer_->RegisterCollectable(server->registry_);
    const std::vector<int> ports = server->exposer_->GetListeningPorts();
    if (ports.empty() || ports.front() <= 0) {
      return absl::UnavailableError(
          absl::StrCat("metrics endpoint on ", bind_address, ": no listening port"));
    }
    server->port_ = ports.front();
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint cannot bind ", bind_address, ": ", e.what()));
  } catch (...) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint cannot bind ", bind_address));
  }
  return server;
}

// The exposer (declared after the registry) stops serving before the registry
// goes.
MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const { return port_; }

prometheus::Registry& MetricsServer::registry() { return *registry_; }

std::string TextExposition(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

// --------------------------------------------------------- StageMetrics ----

struct StageMetrics::Impl {
  Registry* registry;
  StageFamilies* families;
  // Updates hold mu shared; Retire holds it exclusively, so no update touches
  // a series while it is removed.
  mutable absl::Mutex mu;
  StageSeries* series ABSL_GUARDED_BY(mu) = nullptr;  // null once retired
  // The totals when retired (summaries may still ask).
  double idle_total ABSL_GUARDED_BY(mu) = 0;
  int64_t bytes_total[2] ABSL_GUARDED_BY(mu) = {0, 0};  // received, sent
  std::atomic<int64_t> compute_us{0};

  void Release() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (series == nullptr) return;
    idle_total = series->idle->Value();
    bytes_total[0] = static_cast<int64_t>(series->bytes_received->Value());
    bytes_total[1] = static_cast<int64_t>(series->bytes_sent->Value());
    families->ReleaseSeries(series);
    series = nullptr;
  }
};

StageMetrics::StageMetrics(prometheus::Registry& registry, const std::string& job, int stage,
                           const std::string& algorithm, int replica)
    : impl_(std::make_unique<Impl>()) {
  impl_->registry = &registry;
  impl_->families = &StageCache().Acquire(registry);
  prometheus::Labels labels{
      {"job", job}, {"stage", std::to_string(stage)}, {"algorithm", algorithm}};
  if (replica >= 0) labels["replica"] = std::to_string(replica);
  absl::MutexLock lock(&impl_->mu);
  impl_->series = impl_->families->AcquireSeries(labels);
}

StageMetrics::~StageMetrics() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->Release();
  }
  StageCache().Release(*impl_->registry);
}

void StageMetrics::Retire() {
  absl::MutexLock lock(&impl_->mu);
  impl_->Release();
}

void StageMetrics::ObserveCompute(const std::string& phase, double seconds) {
  if (phase != "checkpoint" && seconds > 0) {
    impl_->compute_us.fetch_add(static_cast<int64_t>(seconds * 1e6));
  }
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  impl_->families->Compute(*impl_->series, phase)->Observe(seconds);
}

void StageMetrics::AddIdle(double seconds) {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  if (seconds > 0) impl_->series->idle->Increment(seconds);
}

void StageMetrics::SetInboxDepth(int64_t depth) {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  impl_->series->inbox->Set(static_cast<double>(depth));
}

void StageMetrics::AddBytes(bool sent, int64_t bytes) {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  StageSeries& series = *impl_->series;
  if (bytes > 0) {
    (sent ? series.bytes_sent : series.bytes_received)->Increment(static_cast<double>(bytes));
  }
  (sent ? series.messages_sent : series.messages_received)->Increment();
}

void StageMetrics::SetStaleness(int64_t steps) {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  impl_->series->staleness->Set(static_cast<double>(steps));
}

void StageMetrics::SetMemory(const std::string& kind, int64_t bytes) {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  impl_->families->Memory(*impl_->series, kind)->Set(static_cast<double>(bytes));
}

void StageMetrics::SetMessageBytes(const std::string& kind, int64_t bytes) {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  impl_->families->Message(*impl_->series, kind)->Set(static_cast<double>(bytes));
}

void StageMetrics::SetValue(const std::string& name, double value) {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  impl_->families->Value(*impl_->series, name)->Set(value);
}

void StageMetrics::IncSteps() {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return;
  impl_->series->steps->Increment();
}

double StageMetrics::compute_seconds() const {
  return static_cast<double>(impl_->compute_us.load()) / 1e6;
}

double StageMetrics::idle_seconds() const {
  absl::ReaderMutexLock lock(&impl_->mu);
  return impl_->series == nullptr ? impl_->idle_total : impl_->series->idle->Value();
}

int64_t StageMetrics::bytes(bool sent) const {
  absl::ReaderMutexLock lock(&impl_->mu);
  if (impl_->series == nullptr) return impl_->bytes_total[sent ? 1 : 0];
  const Counter* counter = sent ? impl_->series->bytes_sent : impl_->series->bytes_received;
  return static_cast<int64_t>(counter->Value());
}

// --------------------------------------------------- CoordinatorMetrics ----

struct CoordinatorMetrics::Impl {
  Registry* registry;
  CoordinatorFamilies* families;
  JobLabels labels;
};

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry, JobLabels labels)
    : impl_(std::make_unique<Impl>()) {
  impl_->registry = &registry;
  impl_->labels = std::move(labels);
  impl_->families = &CoordinatorCache().Acquire(registry);
}

CoordinatorMetrics::~CoordinatorMetrics() { CoordinatorCache().Release(*impl_->registry); }

void CoordinatorMetrics::SetJobProgress(const std::string& job, int64_t step, double train_loss,
                                        double samples_per_second) {
  if (impl_->labels.mode == JobLabels::Mode::kOmitted) return;  // no per-job series
  impl_->families->SetJobProgress(impl_->labels.Of(job), step, train_loss, samples_per_second);
}

void CoordinatorMetrics::SetJobEval(const std::string& job, double loss, double accuracy) {
  if (impl_->labels.mode == JobLabels::Mode::kOmitted) return;
  impl_->families->SetJobEval(impl_->labels.Of(job), loss, accuracy);
}

void CoordinatorMetrics::SetJobText(const std::string& job, double tokens_per_second,
                                    double eval_bits_per_byte) {
  if (impl_->labels.mode == JobLabels::Mode::kOmitted) return;
  impl_->families->SetJobText(impl_->labels.Of(job), tokens_per_second, eval_bits_per_byte);
}

void CoordinatorMetrics::SetJobsInState(const std::string& state, int64_t count) {
  impl_->families->SetJobsInState(state, count);
}

void CoordinatorMetrics::SetWorkers(int64_t idle, int64_t busy) {
  impl_->families->SetWorkers(idle, busy);
}

void CoordinatorMetrics::SetGoodput(const std::map<std::string, double>& by_use, double ratio) {
  impl_->families->SetGoodput(by_use, ratio);
}

void CoordinatorMetrics::CountTransition(const std::string& to_state) {
  impl_->families->CountTransition(to_state);
}

void CoordinatorMetrics::RemoveJob(const std::string& job) {
  if (impl_->labels.mode == JobLabels::Mode::kOmitted) return;
  impl_->families->RemoveJob(impl_->labels.Of(job));
}

void CoordinatorMetrics::CountRestart(const std::string& cause) {
  impl_->families->CountRestart(cause);
}

void CoordinatorMetrics::CountRefused(const std::string& reason) {
  impl_->families->CountRefused(reason);
}

void CoordinatorMetrics::AddStepsRedone(int64_t steps) { impl_->families->AddStepsRedone(steps); }

void CoordinatorMetrics::CountCheckpoint() { impl_->families->CountCheckpoint(); }

void CoordinatorMetrics::ObserveRecovery(double seconds) {
  impl_->families->ObserveRecovery(seconds);
}

}  // namespace stagewise::metrics
