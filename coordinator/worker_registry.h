// The coordinator's worker registry: which workers registered, which of them
// have a control stream open (and through which CommandSink), when each was
// last heard from, and which job stage each one runs (idle / busy).
//
// Threading: thread-safe. One mutex guards everything and is a leaf lock: it
// is held only for in-memory bookkeeping and for CommandSink::Send/Close,
// which never block. gRPC callback threads call Register, Connect, Disconnect
// and Touch directly (so a connect is refused at once, and a heartbeat never
// waits behind a disk write); the JobManager's loop thread claims and releases
// workers, sends commands and expires silent workers; ListWorkers may be called
// from anywhere.
//
// Sinks: a sink given to Connect is used only until Disconnect(id, sink)
// returns or the registry removes the worker (Expire, a second Register); after
// that the registry never touches it again, so its owner may delete it.
#ifndef STAGEWISE_COORDINATOR_WORKER_REGISTRY_H_
#define STAGEWISE_COORDINATOR_WORKER_REGISTRY_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

// The placement label of a job whose `device` is cuda or cuda:N: only
// workers on a CUDA device (WorkerInfo.device cuda or cuda:N) match it.
inline constexpr char kNeedsCudaLabel[] = "device=cuda";
// Whether `info` was registered with every "key=value" of `labels`;
// kNeedsCudaLabel (a job's `device: cuda`) matches a worker on any CUDA device.
bool HasLabels(const v1::WorkerInfo& info, const std::vector<std::string>& labels);

// How the coordinator reaches one connected worker (its control stream).
class CommandSink {
 public:
  virtual ~CommandSink() = default;
  // Non-blocking; false once the stream is gone.
  virtual bool Send(const v1::Command& command) = 0;
  // Ends the stream with `status` (e.g. the worker missed its heartbeats).
  virtual void Close(const absl::Status& status) = 0;
};

class WorkerRegistry {
 public:
  // A worker that left the registry, and the job stage it was running (if any).
  struct Removed {
    std::string worker_id;
    std::string job_id;  // empty when it was idle
    int stage = -1;
    int replica = -1;  // replicated stages only (docs/replicas.md)
  };
  struct Counts {
    int idle = 0;        // connected, no job
    int busy = 0;        // running a job stage
    int registered = 0;  // every worker, connected or not
    int gpu = 0;         // of them on a CUDA device (kNeedsCudaLabel)
  };

  WorkerRegistry() = default;
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // Who registers and how (the coordinator fills it from the call).
  struct Caller {
    // The authenticated identity (the Common Name of the peer's verified
    // certificate); empty on a plaintext channel.
    std::string identity;
  };
  // Most workers one coordinator keeps (registrations beyond it are refused).
  static constexpr size_t kMaxWorkers = 4096;

  // The worker's id: info.worker_id, or its address when that is empty. A
  // worker that registers again (it restarted) replaces its old entry while
  // the old one has no open control stream (the old entry is returned in
  // `*replaced`); while the old stream is open the registration is refused
  // with ALREADY_EXISTS (the worker retries: a dead stream closes, or misses
  // its heartbeats). Fills `*session` with the secret the control stream must
  // present. INVALID_ARGUMENT for a bad WorkerInfo (named field).
  absl::StatusOr<std::string> Register(const v1::WorkerInfo& info, const Caller& caller,
                                       absl::Time now, std::optional<Removed>* replaced,
                                       std::string* session);
  // The worker's control stream is open. NOT_FOUND if it never registered;
  // PERMISSION_DENIED if `session` is not its registration's or the caller is
  // another identity; ALREADY_EXISTS if it has an open stream already.
  absl::Status Connect(const std::string& worker_id, const std::string& session,
                       const Caller& caller, CommandSink* sink, absl::Time now);
  // OK when `session` is the registration of `worker_id` and `caller` its
  // identity (a unary call on the worker's behalf, e.g. CollectiveStore).
  absl::Status CheckSession(const std::string& worker_id, const std::string& session,
                            const Caller& caller) const;
  // The stream ended: removes the worker if `sink` is still its stream (a newer
  // stream of the same worker keeps it).
  std::optional<Removed> Disconnect(const std::string& worker_id, CommandSink* sink);
  // Records that the worker was heard from; false if it is not registered.
  bool Touch(const std::string& worker_id, absl::Time now);
  // Removes every worker silent for longer than `timeout` and closes its
  // stream with UNAVAILABLE.
  std::vector<Removed> Expire(absl::Time now, absl::Duration timeout);
  // When the first worker would expire (InfiniteFuture when there is none).
  absl::Time NextExpiry(absl::Duration timeout) const;

  Counts GetCounts() const;
  // Gives stages 0..n-1 of `job_id` to the first n idle workers (by id), all at
  // once; empty (and nothing claimed) when fewer than n are idle. With
  // `distinct_identities`, no two of them share a certificate identity (an
  // empty identity, plaintext, is never shared).
  // `stages` (J, 0: n) tells how the n slots map onto stages: slot s runs
  // stage s % J of replica s / J (docs/replicas.md), which List() shows.
  // `labels` (placement.labels, "key=value", and kNeedsCudaLabel for a job
  // on `device: cuda`): only workers registered with
  // every one of them (stagewise-worker --label).
  std::vector<std::string> Claim(const std::string& job_id, int n, bool distinct_identities = false,
                                 int stages = 0, const std::vector<std::string>& labels = {});
  // recovery.replay: one idle worker carrying every one of `labels`, whose
  // certificate identity is none of `taken` (unless empty), for stage
  // `stage` of `job_id`; "" when there is none.
  std::string ClaimOne(const std::string& job_id, int stage, const std::vector<std::string>& labels,
                       const std::set<std::string>& taken);
  // Idle workers that carry every one of `labels` ("key=value").
  int IdleWith(const std::vector<std::string>& labels) const;
  // WorkerEvent.preempting: the worker exits soon; it is never claimed again
  // (a restart re-registers it afresh) and listed as "draining". The job it
  // runs a stage of ("" when idle), or nullopt when it is not registered.
  std::optional<std::string> MarkDraining(const std::string& worker_id);
  // The certificate identity the worker registered with ("" when it is gone
  // or registered over plaintext).
  std::string Identity(const std::string& worker_id) const;
  // Frees every worker still running a stage of `job_id`; returns their ids.
  std::vector<std::string> Release(const std::string& job_id);
  // The registration of a worker (nullopt if it is gone).
  std::optional<v1::WorkerInfo> Info(const std::string& worker_id) const;
  // Sends on the worker's stream; false if it is gone or not connected.
  bool Send(const std::string& worker_id, const v1::Command& command);

  // Every worker, with labels state = registering | idle | busy and, when
  // busy, job and stage.
  std::vector<v1::WorkerInfo> List() const;
  // When each worker was last heard from (registration, any event).
  std::map<std::string, absl::Time> LastSeen() const;

 private:
  struct Worker {
    v1::WorkerInfo info;
    CommandSink* sink = nullptr;  // null until Connect
    std::string session;          // RegisterWorkerResponse.session
    std::string identity;         // Caller::identity at registration
    absl::Time last_seen;
    std::string job_id;  // empty when idle
    int stage = -1;
    int replica = -1;       // only when the job has several replicas
    bool draining = false;  // WorkerEvent.preempting: it is going away
  };

  mutable absl::Mutex mu_;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_WORKER_REGISTRY_H_
