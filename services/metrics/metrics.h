// Prometheus metrics for every stagewise process: one registry per process,
// families built once, names stagewise_<component>_<name>_<unit>, an HTTP
// /metrics endpoint. No LibTorch.
#ifndef STAGEWISE_SERVICES_METRICS_METRICS_H_
#define STAGEWISE_SERVICES_METRICS_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prometheus {
class Registry;
class Exposer;
}  // namespace prometheus

namespace stagewise::metrics {

// The process registry plus its HTTP exposer.
class MetricsServer {
 public:
  // Serves /metrics on `bind_address` ("127.0.0.1:0" picks a free port).
  // An empty address creates the registry without an HTTP endpoint.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& bind_address);
  ~MetricsServer();
  int port() const;  // 0 without an endpoint
  prometheus::Registry& registry();

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// clang-format off
// What a stage reports (labels job, stage, algorithm on every series, and
// replica when the job's stages are replicated, docs/replicas.md):
//   stagewise_stage_compute_seconds{phase}        histogram (forward, backward, recompute, step, eval)
//   stagewise_stage_idle_seconds_total            counter: compute thread waiting for a message
//   stagewise_stage_inbox_depth                   gauge
//   stagewise_transport_bytes_total{direction}    counter: sent | received
//   stagewise_transport_messages_total{direction} counter
//   stagewise_stage_staleness_steps               gauge: steps between a sample's forward and backward
//   stagewise_stage_memory_bytes{kind}            gauge, bytes held by kind (free-form; set today:
//       parameters, tensors, tensors_peak (StageRuntime); activations (backprop); inputs
//       (delayed, petra, features_replay); stashed_parameters (delayed); verify_inputs
//       (petra with verify_rebuild); aux_head_parameters (nwise); auxnet_parameters
//       (auxnet). docs/metrics.md says what each counts)
//   stagewise_stage_steps_total                   counter: optimizer steps
//   stagewise_stage_message_bytes{kind}           gauge: size of the last message sent (forward, backward, eval)
//   stagewise_stage_algorithm_value{name}         gauge: algorithm-specific quantities (auxnet: constraint_violation, ...)
// clang-format on
// Thread-safe; cheap enough to call per message.
// Objects for the same registry share its families; objects with the same
// (job, stage, algorithm) share their series. The destructor removes the
// series once the last object holding them goes, so finished jobs do not pile
// up. A StageMetrics must not outlive its registry.
class StageMetrics {
 public:
  StageMetrics(prometheus::Registry& registry, const std::string& job, int stage,
               const std::string& algorithm, int replica = -1);  // -1: no replica label
  ~StageMetrics();
  // The stage ended: its series leave the endpoint now (the object stays
  // valid; later updates are dropped, the totals below keep their values).
  void Retire();
  void ObserveCompute(const std::string& phase, double seconds);
  void AddIdle(double seconds);
  void SetInboxDepth(int64_t depth);
  void AddBytes(bool sent, int64_t bytes);  // also counts one message
  void SetStaleness(int64_t steps);
  void SetMemory(const std::string& kind, int64_t bytes);
  void SetMessageBytes(const std::string& kind, int64_t bytes);
  void SetValue(const std::string& name, double value);
  void IncSteps();
  // Totals for summaries and tests.
  double idle_seconds() const;
  // Every ObserveCompute but checkpoints', whether or not the series are
  // still exported (rebalancing compares it with the plan).
  double compute_seconds() const;
  int64_t bytes(bool sent) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How job ids appear in the `job` label of /metrics series
// (--metrics-job-ids, docs/security.md): as they are, as a keyed hash, or not
// at all.
struct JobLabels {
  enum class Mode { kPlain, kHashed, kOmitted };
  Mode mode = Mode::kPlain;
  std::string key;  // kHashed: the HMAC key (at least 16 bytes)
  // The label value of `job_id`: the id; "h" and the first 16 hex digits of
  // HMAC-SHA256(key, id); or "" (omitted).
  std::string Of(const std::string& job_id) const;
};
// From the flags: mode "plain", "hashed" (needs `key_file`: its bytes, without
// a trailing newline, are the key) or "omitted". INVALID_ARGUMENT naming
// --metrics-job-ids or --metrics-job-key-file otherwise.
absl::StatusOr<JobLabels> MakeJobLabels(const std::string& mode, const std::string& key_file);

// What the coordinator reports (thread-safe; objects on one registry share
// families and series; must not outlive the registry):
//   stagewise_job_train_loss{job}, stagewise_job_eval_loss{job}, stagewise_job_eval_accuracy{job}
//   stagewise_job_samples_per_second{job}, stagewise_job_step{job}       gauges
//   stagewise_job_tokens_per_second{job}, stagewise_job_eval_bits_per_byte{job}
//                                                   gauges, text jobs only (docs/text.md)
//   stagewise_coordinator_jobs{state}                                      gauge per state
//   stagewise_coordinator_workers{state}                                   gauge: idle | busy
//   stagewise_coordinator_job_transitions_total{to}                        counter
//   stagewise_coordinator_refused_total{reason}                            counter
class CoordinatorMetrics {
 public:
  // Per-job series are labelled with labels.Of(job) (none when omitted).
  explicit CoordinatorMetrics(prometheus::Registry& registry, JobLabels labels = {});
  ~CoordinatorMetrics();
  void SetJobProgress(const std::string& job, int64_t step, double train_loss,
                      double samples_per_second);
  void SetJobEval(const std::string& job, double loss, double accuracy);
  // A text job's throughput in bytes predicted per second, and (when >= 0)
  // its latest evaluation loss in bits per byte.
  void SetJobText(const std::string& job, double tokens_per_second, double eval_bits_per_byte);
  void SetJobsInState(const std::string& state, int64_t count);
  void SetWorkers(int64_t idle, int64_t busy);
  // The cluster's worker-seconds by use and its goodput (docs/operations.md).
  void SetGoodput(const std::map<std::string, double>& by_use, double ratio);
  void CountTransition(const std::string& to_state);
  // Drops the stagewise_job_*{job} series of a finished or deleted job.
  void RemoveJob(const std::string& job);
  // Fault tolerance: an attempt ended early and the job is recovering
  // (`cause`: worker_lost, stage_error, ...); steps trained again; a
  // checkpoint committed; seconds from an attempt's end to the next running.
  void CountRestart(const std::string& cause);
  void AddStepsRedone(int64_t steps);
  void CountCheckpoint();
  void ObserveRecovery(double seconds);
  // Security (docs/security.md): a request or worker event was refused or
  // ignored, by reason.
  void CountRefused(const std::string& reason);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GET http://host:port/metrics over a plain socket (tests, `stagewise local`).
// Fails (never hangs) after 5 s.
absl::StatusOr<std::string> Scrape(const std::string& host, int port);
// The same with an explicit overall deadline for connect, send and receive.
absl::StatusOr<std::string> Scrape(const std::string& host, int port, absl::Duration timeout);

// The registry in Prometheus text exposition format, without HTTP.
std::string TextExposition(prometheus::Registry& registry);

// Value of the first sample of `name` whose labels include every pair in
// `labels` in Prometheus text exposition `text`; NOT_FOUND otherwise.
absl::StatusOr<double> FindSample(const std::string& text, const std::string& name,
                                  const std::map<std::string, std::string>& labels = {});

}  // namespace stagewise::metrics

#endif  // STAGEWISE_SERVICES_METRICS_METRICS_H_
