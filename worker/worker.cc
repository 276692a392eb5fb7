#include "worker/worker.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/log.h"
#include "services/common/retry_policy.h"
#include "services/common/version.h"
#include "services/planner/plan_proto.h"
#include "services/profiler/profiler.h"
#include "services/rpc/outbox.h"
#include "services/rpc/status.h"
#include "services/rpc/tls.h"
#include "worker/coordinator_store.h"
#include "worker/stream_gate.h"

namespace stagewise::worker {

namespace {

// An Exchange call refused before it starts: finishes with `status` at once.
class RefusedExchange : public grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage> {
 public:
  explicit RefusedExchange(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

// StageService. Every Exchange stream takes a slot of --max-streams until it
// is destroyed; before its first message it is also pending in the gate
// (stream_gate.h): at most --max-pending-streams of those, each for at most
// --stream-first-message-timeout. A reaper thread closes the expired ones.
class Worker::Service : public v1::StageService::CallbackService {
 public:
  Service(Worker* worker, const WorkerOptions& options, prometheus::Registry& registry)
      : worker_(worker),
        open_(std::make_shared<std::atomic<int>>(0)),
        max_streams_(options.max_streams),
        require_worker_identity_(options.require_worker_identity),
        first_message_timeout_(options.first_message_timeout),
        pending_(std::make_shared<Pending>(
            StreamGate::Options{options.max_pending_streams, options.first_message_timeout})),
        refused_(prometheus::BuildCounter()
                     .Name("stagewise_worker_streams_refused_total")
                     .Help("Exchange streams the worker refused or closed before they carried a "
                           "stage's traffic, by reason (too_many, evicted, no_first_message, "
                           "not_a_worker, not_assigned).")
                     .Register(registry)),
        reaper_([this] { Reap(); }) {}
  ~Service() override {
    {
      absl::MutexLock lock(&pending_->mu);
      pending_->stopping = true;
    }
    reaper_.join();
  }

  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext* ctx) override {
    const std::string identity = rpc::PeerIdentity(*ctx->auth_context());
    if (require_worker_identity_ && !rpc::IsWorkerIdentity(identity)) {
      // Only workers feed stages: a client's or dashboard's certificate is
      // refused before it takes any slot.
      refused_.Add({{"reason", "not_a_worker"}}).Increment();
      return new RefusedExchange(grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("certificate '", identity.substr(0, 128),
                       "' is not a worker's (worker certificates have the Common Name worker, "
                       "worker-* or worker.*)")));
    }
    // A slot per open stream, given back when the stream is destroyed.
    if (open_->fetch_add(1) >= max_streams_) {
      open_->fetch_sub(1);
      refused_.Add({{"reason", "too_many"}}).Increment();
      return new RefusedExchange(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                              absl::StrCat("this worker already has ", max_streams_,
                                                           " stage streams open (--max-streams)")));
    }
    std::string peer = identity.empty() ? PeerHost(ctx->peer()) : identity;
    Pending& p = *pending_;
    uint64_t ticket = 0;
    std::vector<std::weak_ptr<PeerStream>> victims;
    {
      absl::MutexLock lock(&p.mu);
      const StreamGate::Admitted admitted = p.gate.Admit(peer, absl::Now());
      ticket = admitted.ticket;
      for (uint64_t victim : admitted.evict) victims.push_back(p.DoomLocked(victim, "evicted"));
      p.wake = true;  // the reaper's next deadline may be this one
    }
    // Given back when the stream is destroyed (which may be after the service).
    std::shared_ptr<void> slot(nullptr, [open = open_, pending = pending_, ticket](void*) {
      open->fetch_sub(1);
      absl::MutexLock lock(&pending->mu);
      pending->Forget(ticket);
    });
    UpstreamStream* stream = UpstreamStream::Start(
        [this, slot, ticket, identity](const v1::StageMessage& first,
                                       std::shared_ptr<UpstreamStream> s,
                                       MessageSink** sink) -> absl::Status {
          {
            absl::MutexLock lock(&pending_->mu);
            if (pending_->doomed.count(ticket)) {
              return absl::ResourceExhaustedError(
                  "this stream was closed before its first message");
            }
            pending_->Forget(ticket);  // bound (or refused below): no longer pending
          }
          absl::Status routed = worker_->Route(first, identity, std::move(s), sink);
          if (absl::IsPermissionDenied(routed)) {
            refused_.Add({{"reason", "not_assigned"}}).Increment();
          }
          return routed;
        },
        /*outbox_capacity=*/16);
    const char* doomed = nullptr;
    {
      absl::MutexLock lock(&p.mu);
      auto it = p.doomed.find(ticket);
      if (it != p.doomed.end()) {
        doomed = it->second;  // evicted or expired before it was registered here
      } else if (p.gate.IsPending(ticket)) {
        p.streams[ticket] = stream->weak_from_this();
      }
    }
    if (doomed != nullptr) CloseStream(stream->weak_from_this(), doomed);
    for (std::weak_ptr<PeerStream>& victim : victims) CloseStream(std::move(victim), "evicted");
    return stream;
  }

  // recovery.replay with replicas: a replacing replica copies this one's
  // state. Only workers ask; the stage checks the copy's token.
  grpc::ServerUnaryReactor* CopyReplica(grpc::CallbackServerContext* ctx,
                                        const v1::CopyReplicaRequest* request,
                                        v1::CopyReplicaResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    const std::string identity = rpc::PeerIdentity(*ctx->auth_context());
    if (require_worker_identity_ && !rpc::IsWorkerIdentity(identity)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                   "CopyReplica: only workers copy a replica's state"));
    } else {
      reactor->Finish(rpc::ToGrpcStatus(worker_->CopyReplica(*request, response)));
    }
    return reactor;
  }

 private:
  // The streams that have not sent their first message, shared with every
  // stream's slot (a bound stream may outlive the service).
  struct Pending {
    explicit Pending(StreamGate::Options options) : gate(options) {}
    // The gate's answer for `ticket` is final: the stream may not bind any
    // more, and is closed (now if registered, else when it is).
    std::weak_ptr<PeerStream> DoomLocked(uint64_t ticket, const char* reason)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      doomed[ticket] = reason;
      std::weak_ptr<PeerStream> stream;
      auto it = streams.find(ticket);
      if (it != streams.end()) {
        stream = std::move(it->second);
        streams.erase(it);
      }
      return stream;
    }
    void Forget(uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      gate.Settle(ticket);
      streams.erase(ticket);
      doomed.erase(ticket);
    }
    bool ShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return wake || stopping; }

    absl::Mutex mu;
    StreamGate gate;  // used under mu (its own lock nests inside)
    std::map<uint64_t, std::weak_ptr<PeerStream>> streams ABSL_GUARDED_BY(mu);
    std::map<uint64_t, const char*> doomed ABSL_GUARDED_BY(mu);  // ticket -> reason
    bool wake ABSL_GUARDED_BY(mu) = false;
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };

  // "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7": a plaintext peer is its host.
  static std::string PeerHost(const std::string& peer) {
    const size_t colon = peer.rfind(':');
    return colon == std::string::npos ? peer : peer.substr(0, colon);
  }

  void CloseStream(std::weak_ptr<PeerStream> weak, const char* reason) {
    std::shared_ptr<PeerStream> stream = weak.lock();
    if (stream == nullptr || stream->done()) return;  // the peer hung up meanwhile
    refused_.Add({{"reason", reason}}).Increment();
    if (std::string(reason) == "evicted") {
      stream->Close(absl::ResourceExhaustedError(
          "closed before its first message: this worker has too many Exchange streams without "
          "one (--max-pending-streams), and this one was the oldest of the busiest peer"));
    } else {
      stream->Close(absl::DeadlineExceededError(
          absl::StrCat("no StageMessage within ", absl::FormatDuration(first_message_timeout_),
                       " of opening the stream (--stream-first-message-timeout)")));
    }
  }

  // Closes the pending streams whose first-message deadline passed; sleeps
  // until the next deadline or a new stream.
  void Reap() {
    Pending& p = *pending_;
    for (;;) {
      std::vector<std::weak_ptr<PeerStream>> expired;
      {
        absl::MutexLock lock(&p.mu);
        p.mu.AwaitWithDeadline(absl::Condition(&p, &Pending::ShouldWake), p.gate.NextDeadline());
        if (p.stopping) return;
        p.wake = false;
        for (uint64_t ticket : p.gate.TakeExpired(absl::Now())) {
          expired.push_back(p.DoomLocked(ticket, "no_first_message"));
        }
      }
      for (std::weak_ptr<PeerStream>& stream : expired) {
        CloseStream(std::move(stream), "no_first_message");
      }
    }
  }

  Worker* worker_;
  std::shared_ptr<std::atomic<int>> open_;
  const int max_streams_;
  // TLS is on: Exchange takes only worker certificates (rpc::IsWorkerIdentity).
  const bool require_worker_identity_;
  const absl::Duration first_message_timeout_;
  const std::shared_ptr<Pending> pending_;
  prometheus::Family<prometheus::Counter>& refused_;
  std::thread reaper_;  // last: it starts once everything above is built
};

// The control stream: a callback reactor whose writes go through an Outbox
// (bounded, one write in flight) and whose reads hand each command to
// Worker::Dispatch. A hold keeps the call alive while writes may still start
// from other threads; it goes when the outbox finishes (the read side ended).
class Worker::ControlStream : public grpc::ClientBidiReactor<v1::WorkerEvent, v1::Command> {
 public:
  ControlStream(Worker* worker, size_t capacity)
      : worker_(worker),
        outbox_("control stream", capacity,
                {[this](const v1::WorkerEvent* e) { StartWrite(e); },
                 [this](const absl::Status&) { RemoveHold(); }}) {}

  // The caller keeps the stream (a shared_ptr) until WaitDone returns true:
  // it is then destroyed on the caller's thread, never on gRPC's after the
  // worker went on to tear down the channel.
  void Start(v1::Coordinator::Stub* stub) {
    stub->async()->Control(&context_, this);
    AddHold();
    StartRead(&command_);
    StartCall();
  }
  // Waits for room; fails once the stream is closing or done.
  absl::Status Send(v1::WorkerEvent event) { return outbox_.Send(std::move(event)); }
  absl::Status TrySend(v1::WorkerEvent event) { return outbox_.TrySend(std::move(event)); }
  void Cancel() { context_.TryCancel(); }
  // True once the call is over; waits at most `timeout` for it.
  bool WaitDone(absl::Duration timeout) { return done_.WaitForNotificationWithTimeout(timeout); }
  const grpc::Status& status() const { return status_; }  // once done

  void OnReadDone(bool ok) override {
    if (!ok) {
      outbox_.Close(absl::UnavailableError("the control stream's read side ended"));
      return;
    }
    worker_->Dispatch(command_);
    StartRead(&command_);
  }
  void OnWriteDone(bool ok) override { outbox_.OnWriteDone(ok); }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    outbox_.OnDone(rpc::FromGrpcStatus(status));
    done_.Notify();  // the last touch of this object: the owner may destroy it now
  }

 private:
  Worker* const worker_;
  grpc::ClientContext context_;
  v1::Command command_;
  rpc::Outbox<v1::WorkerEvent> outbox_;
  grpc::Status status_;
  absl::Notification done_;
};

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {}

Worker::~Worker() { Shutdown(); }

std::string Worker::address() const {
  std::string host = options_.advertise;
  if (host.empty()) {
    char name[256] = {0};
    host = gethostname(name, sizeof(name) - 1) == 0 ? name : "127.0.0.1";
  }
  return absl::StrCat(host, ":", port_);
}

absl::Status Worker::Start() {
  try {
    device_ = torch::Device(options_.device);
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", options_.device, "' is not a device (cpu, cuda:N)"));
  }
  if (device_.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError("--device: CUDA requested but LibTorch sees no GPU");
  }
  auto metrics = metrics::MetricsServer::Start(options_.metrics_listen);
  if (!metrics.ok()) return metrics.status();
  metrics_ = std::move(*metrics);

  service_ = std::make_unique<Service>(this, options_, metrics_->registry());
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(options_.rpc, &builder);
  builder.AddListeningPort(options_.listen, rpc::ServerCredentials(options_.rpc), &port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--listen: cannot serve on ", options_.listen));
  }
  coordinator_channel_ = rpc::MakeChannel(options_.coordinator, options_.rpc);
  coordinator_ = v1::Coordinator::NewStub(coordinator_channel_);
  control_thread_ = std::thread([this] { ControlLoop(); });
  emulated_speed_.store(options_.emulated_speed);
  if (!options_.emulated_speed_file.empty()) {
    speed_thread_ = std::thread([this] { FollowSpeedFile(); });
  }
  return absl::OkStatus();
}

void Worker::Shutdown() {
  if (shutdown_.exchange(true)) return;
  shutdown_requested_.Notify();
  const absl::Time start = absl::Now();
  auto phase = [&](const char* what) {
    STAGEWISE_LOG(INFO) << "shutdown: " << what << " after "
                        << absl::FormatDuration(absl::Now() - start);
  };
  std::shared_ptr<ControlStream> control;
  {
    absl::MutexLock lock(&mu_);
    control = control_;
  }
  if (!runtimes().empty()) {
    StopAll(absl::CancelledError("the worker is shutting down"), false);
    phase("stage stopped");
  }
  if (control) control->Cancel();
  if (control_thread_.joinable()) control_thread_.join();
  if (speed_thread_.joinable()) speed_thread_.join();
  phase("control stream closed");
  // Commands already handed on still run (they find the stage stopped).
  stage_tasks_.Stop();
  profile_tasks_.Stop();
  StopAll(absl::CancelledError("the worker is shutting down"), false);
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  phase("server stopped");
}

std::shared_ptr<StageRuntime> Worker::runtime() const {
  absl::MutexLock lock(&mu_);
  return runtimes_.empty() ? nullptr : runtimes_.front();
}

std::vector<std::shared_ptr<StageRuntime>> Worker::runtimes() const {
  absl::MutexLock lock(&mu_);
  return runtimes_;
}

void Worker::StopAll(const absl::Status& why, bool only_running) {
  const std::vector<std::shared_ptr<StageRuntime>> all = runtimes();
  // Stop them all first: a chunk may wait on another (its turns, its data).
  for (const auto& rt : all) {
    if (!only_running || rt->running()) rt->Stop(why);
  }
  for (const auto& rt : all) rt->Join();
}

bool Worker::registered() const {
  absl::MutexLock lock(&mu_);
  return control_ != nullptr;
}

void Worker::ControlLoop() {
  // Exponential backoff while the coordinator stays away (restarting,
  // rescheduled); back to the shortest delay once a session was established.
  absl::Duration delay = options_.reconnect;
  absl::BitGen gen;
  while (!shutdown_) {
    bool established = false;
    absl::Status s = ControlSession(&established);
    if (shutdown_) break;
    if (established) delay = options_.reconnect;
    // Jittered: every worker of a restarted coordinator redials, not at once.
    const absl::Duration wait = Jittered(delay, gen);
    STAGEWISE_LOG(WARNING) << "control session ended: " << s << "; reconnecting in "
                           << absl::FormatDuration(wait);
    if (shutdown_requested_.WaitForNotificationWithTimeout(wait)) break;
    delay = std::min(delay * 2, std::max(options_.max_reconnect, options_.reconnect));
  }
}

absl::Status Worker::ControlSession(bool* established) {
  v1::RegisterWorkerRequest req;
  v1::WorkerInfo* info = req.mutable_worker();
  info->set_worker_id(options_.name.empty() ? address() : options_.name);
  info->set_address(address());
  info->set_device(options_.device);
  info->set_memory_bytes(options_.memory_bytes);
  for (const auto& [key, value] : options_.labels) (*info->mutable_labels())[key] = value;
  info->set_version(Version());
  info->set_protocol(v1::CONTROL_PROTOCOL_V6);
  v1::RegisterWorkerResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = coordinator_->RegisterWorker(&ctx, req, &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s);
  }
  auto stream = std::make_shared<ControlStream>(this, options_.control_outbox);
  stream->Start(coordinator_.get());
  // The first event opens the stream in this registration's name: it goes
  // before the stream is shared with anyone else who emits.
  v1::WorkerEvent hello;
  hello.set_worker_id(resp.worker_id());
  hello.set_session(resp.session());
  hello.mutable_heartbeat()->set_unix_ms(absl::ToUnixMillis(absl::Now()));
  hello.mutable_heartbeat()->set_probe_unix_us(ClockSync::NowUs());
  (void)stream->Send(std::move(hello));
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = resp.worker_id();
    session_ = resp.session();
    control_ = stream;
  }
  if (shutdown_) stream->Cancel();  // Shutdown may have looked before control_ was set
  *established = true;
  const absl::Duration beat = resp.heartbeat_interval_ms() > 0
                                  ? absl::Milliseconds(resp.heartbeat_interval_ms())
                                  : options_.heartbeat;
  // Every heartbeat probes the clock; the first few follow each other
  // quickly, so that a job started right away has a good offset estimate.
  for (int beats = 0;; ++beats) {
    const absl::Duration wait = beats < 8 ? std::min(beat, absl::Milliseconds(50)) : beat;
    if (stream->WaitDone(wait)) break;
    v1::WorkerEvent e;
    e.mutable_heartbeat()->set_unix_ms(absl::ToUnixMillis(absl::Now()));
    e.mutable_heartbeat()->set_probe_unix_us(ClockSync::NowUs());
    Emit(std::move(e), /*may_skip=*/true);
  }
  {
    absl::MutexLock lock(&mu_);
    control_.reset();
  }
  // Without its coordinator a job cannot finish; the coordinator re-plans it.
  // The stage thread stops it (this thread never joins a stage).
  stage_tasks_.Post(
      [this] { StopAll(absl::UnavailableError("lost the coordinator"), /*only_running=*/true); });
  return rpc::FromGrpcStatus(stream->status());
}

void Worker::Emit(v1::WorkerEvent event, bool may_skip) {
  std::shared_ptr<ControlStream> stream;
  {
    absl::MutexLock lock(&mu_);
    event.set_worker_id(worker_id_);
    stream = control_;
  }
  if (stream == nullptr) return;  // between sessions: the coordinator re-plans on reconnect
  // A closing stream refuses: the event is lost with the session.
  (void)(may_skip ? stream->TrySend(std::move(event)) : stream->Send(std::move(event)));
}

void Worker::FollowSpeedFile() {
  while (!shutdown_requested_.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
    std::ifstream in(options_.emulated_speed_file);
    double speed = 0;
    if (!(in >> speed) || !(speed > 0 && speed <= 1e6)) continue;  // absent or not a speed yet
    if (emulated_speed_.exchange(speed) != speed) {
      STAGEWISE_LOG(INFO) << "emulated speed now " << speed << " (" << options_.emulated_speed_file
                          << ")";
    }
  }
}

bool Worker::HasRunningStage() const {
  for (const auto& rt : runtimes()) {
    if (rt->running()) return true;
  }
  return false;
}

bool Worker::BeginPreemption(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (control_ == nullptr) return false;
  }
  if (!HasRunningStage()) return false;
  // Without checkpoints there is nothing to wait for: the job recovers as
  // from a lost worker.
  const std::shared_ptr<StageRuntime> rt = runtime();
  if (rt == nullptr || rt->spec().checkpoint.dir.empty()) return false;
  v1::WorkerEvent e;
  e.mutable_preempting()->set_grace_seconds(absl::ToDoubleSeconds(grace));
  Emit(std::move(e));
  return true;
}

void Worker::Ack(int64_t command_id) {
  v1::WorkerEvent e;
  e.mutable_ack()->set_command_id(command_id);
  Emit(std::move(e));
}

void Worker::EmitError(const std::string& job, int stage, const absl::Status& s, int attempt,
                       int replica) {
  v1::WorkerEvent e;
  e.set_job_id(job);
  e.set_stage(stage);
  if (attempt < 0 || replica < 0) {
    std::shared_ptr<StageRuntime> rt = runtime();
    const bool same = rt && rt->job_id() == job;
    if (attempt < 0) attempt = same ? rt->attempt() : 0;
    if (replica < 0) replica = same ? rt->replica() : 0;
  }
  e.set_attempt(attempt);
  e.set_replica(replica);
  auto* err = e.mutable_error();
  err->set_retryable(IsTransient(s));
  err->set_code(static_cast<int>(s.code()));
  err->set_message(absl::StrCat("stage ", stage, " (", address(), "): ", s.message()));
  Emit(std::move(e));
}

// Never blocks and never emits: the slow work and the answers happen on the
// stage and profile threads.
void Worker::Dispatch(const v1::Command& command) {
  switch (command.command_case()) {
    case v1::Command::kConfigure:
    case v1::Command::kStart:
    case v1::Command::kStop:
    case v1::Command::kCheckpointSoon:
    case v1::Command::kNeighbourReplaced:
    case v1::Command::kCheckpointCommitted:
    case v1::Command::kReplicaRegroup:
      if (!stage_tasks_.Post([this, command] { RunStageCommand(command); })) {
        STAGEWISE_LOG(ERROR) << "stage commands are piling up; dropped command "
                             << command.command_id();
      }
      return;
    case v1::Command::kProfile:
      // Profiling takes seconds to minutes: on its own thread, one at a time.
      if (!profile_tasks_.Post([this, id = command.command_id(), c = command.profile()] {
            Ack(id);
            Profile(c);
          })) {
        STAGEWISE_LOG(ERROR) << "profiling requests are piling up; dropped command "
                             << command.command_id();
      }
      return;
    case v1::Command::kClock:  // the answer to a heartbeat's probe; not acknowledged
      clock_->AddSample(command.clock().probe_unix_us(), command.clock().coordinator_unix_us(),
                        ClockSync::NowUs());
      return;
    case v1::Command::COMMAND_NOT_SET:
      // Nothing to do; an empty command is still acknowledged (in order).
      (void)stage_tasks_.Post([this, id = command.command_id()] { Ack(id); });
  }
}

void Worker::Profile(const v1::ProfileCommand& command) {
  models::ScopedEmulatedSpeed speed(emulated_speed_.load());  // measured as its stages run
  auto fail = [&](const absl::Status& s) {
    v1::WorkerEvent e;
    e.set_job_id(command.job_id());
    e.set_stage(-1);
    auto* err = e.mutable_error();
    err->set_code(static_cast<int>(s.code()));
    err->set_message(absl::StrCat("profiling on ", address(), ": ", s.message()));
    Emit(std::move(e));
  };
  auto spec = ParseJobSpec(command.job_spec_yaml());
  if (!spec.ok()) return fail(spec.status());
  if (absl::Status s = ConfineModelFile(&spec->model, options_.model_roots); !s.ok()) {
    return fail(s);
  }
  planner::ProfileOptions options;
  options.cache_dir =
      options_.profile_cache.empty() ? planner::DefaultProfileCacheDir() : options_.profile_cache;
  options.progress = [](const std::string& line) { STAGEWISE_LOG(INFO) << line; };
  bool cached = false;
  auto profile = planner::CachedProfile(*spec, spec->batch_size, device_, options, &cached);
  if (!profile.ok()) return fail(profile.status());
  v1::WorkerEvent e;
  e.set_job_id(command.job_id());
  e.set_stage(-1);
  auto* r = e.mutable_profile();
  *r->mutable_profile() = planner::ToProto(*profile);
  r->set_cached(cached);
  Emit(e);
}

absl::Status Worker::CopyReplica(const v1::CopyReplicaRequest& request,
                                 v1::CopyReplicaResponse* response) {
  for (const auto& rt : runtimes()) {
    if (rt->job_id() == request.job_id() && rt->attempt() == request.attempt() &&
        rt->stage() == request.stage()) {
      return rt->ServeReplicaCopy(request, response);
    }
  }
  return absl::NotFoundError(absl::StrCat("CopyReplica: this worker holds no stage ",
                                          request.stage(), " of attempt ", request.attempt(),
                                          " of job '", request.job_id().substr(0, 64), "'"));
}

absl::Status Worker::Route(const v1::StageMessage& first, const std::string& peer_identity,
                           std::shared_ptr<UpstreamStream> stream, MessageSink** sink) {
  const std::vector<std::shared_ptr<StageRuntime>> all = runtimes();
  if (all.empty() || all.front()->job_id() != first.job_id()) {
    return absl::PermissionDeniedError(
        absl::StrCat("StageMessage.job_id: this worker runs no stage of job '",
                     first.job_id().substr(0, 64), first.job_id().size() > 64 ? "...'" : "'"));
  }
  // The stream from stage j feeds stage j + 1 (interleaved: one of the
  // virtual stages this worker holds); the first one answers otherwise.
  for (const auto& rt : all) {
    if (rt->stage() == first.origin_stage() + 1) {
      return rt->AttachUpstream(first, peer_identity, std::move(stream), sink);
    }
  }
  return all.front()->AttachUpstream(first, peer_identity, std::move(stream), sink);
}

}  // namespace stagewise::worker
