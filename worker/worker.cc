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
#include "services/tensor/host_blocks.h"
#include "services/tensor/host_pinning.h"
#include "worker/coordinator_store.h"
#include "worker/stage_service.h"

namespace stagewise::worker {

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
  if (device_.is_cuda()) {
    EnableDeviceCopies(options_.device_copies == "stream");
    if (DeviceCopiesEnabled() && !HostPinningAvailable()) {
      STAGEWISE_LOG(WARNING) << "--device-copies stream: the CUDA runtime's cudaHostRegister is "
                                "not loaded in this process; the shared rings stay pageable";
    }
  }
  if (options_.host_cache_mib > 0) {
    HostBlockOptions cache;
    cache.max_cached_bytes = static_cast<uint64_t>(options_.host_cache_mib) << 20;
    InstallHostBlockCache(cache);
  }
  auto metrics = metrics::MetricsServer::Start(options_.metrics_listen);
  if (!metrics.ok()) return metrics.status();
  metrics_ = std::move(*metrics);

  StageServiceOptions service;
  service.max_streams = options_.max_streams;
  service.max_pending_streams = options_.max_pending_streams;
  service.require_worker_identity = options_.require_worker_identity;
  service.first_message_timeout = options_.first_message_timeout;
  service.route = [this](const v1::StageMessage& first, const std::string& identity,
                         std::shared_ptr<UpstreamStream> stream, MessageSink** sink) {
    return Route(first, identity, std::move(stream), sink);
  };
  service.copy_replica = [this](const v1::CopyReplicaRequest& request,
                                v1::CopyReplicaResponse* response) {
    return CopyReplica(request, response);
  };
  service_ = std::make_unique<WorkerStageService>(std::move(service), metrics_->registry());
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

// A stage assignment: the stage built (and kept beside the ones of the same
// attempt, interleaved) or the error reported.
void Worker::Configure(const v1::StageAssignment& a, int64_t command_id) {
  std::shared_ptr<StageRuntime> old = runtime();
  // Interleaved: the next virtual stage of the attempt this worker holds
  // joins the ones configured before it.
  const bool same_attempt =
      old && old->job_id() == a.job_id() && old->attempt() == a.attempt() && !old->started();
  bool busy = false;
  for (const auto& rt : runtimes()) busy = busy || rt->running();
  if (busy && !same_attempt) {
    if (old->job_id() != a.job_id()) {
      EmitError(a.job_id(), a.stage(),
                absl::FailedPreconditionError(absl::StrCat("busy with job ", old->job_id())),
                a.attempt());
      return;
    }
    // A new attempt of the job this worker still runs (the coordinator
    // recovered it): the old attempt is over.
    StopAll(absl::AbortedError(absl::StrCat("superseded by attempt ", a.attempt())), false);
  }
  if (options_.before_stage_build) options_.before_stage_build(a);
  RuntimeEnv env = StageEnv();
  {
    absl::MutexLock lock(&mu_);
    if (!same_attempt) turns_ = std::make_shared<DeviceTurns>();
    env.turns = turns_;
  }
  auto rt = StageRuntime::Create(a, std::move(env));
  if (!rt.ok()) {
    EmitError(a.job_id(), a.stage(), rt.status(), a.attempt(), a.replica());
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!same_attempt) runtimes_.clear();
    // A repeated assignment of a stage replaces its runtime.
    runtimes_.erase(std::remove_if(runtimes_.begin(), runtimes_.end(),
                                   [&](const auto& r) { return r->stage() == a.stage(); }),
                    runtimes_.end());
    runtimes_.push_back(*rt);
    std::sort(runtimes_.begin(), runtimes_.end(),
              [](const auto& x, const auto& y) { return x->stage() < y->stage(); });
  }
  Ack(command_id);
}

// What a stage built here runs with (the device turns aside).
RuntimeEnv Worker::StageEnv() {
  RuntimeEnv env;
  env.device = device_;
  env.registry = &metrics_->registry();
  env.job_labels = options_.job_labels;
  env.emit = [this](v1::WorkerEvent e) { Emit(std::move(e)); };
  env.rpc = options_.rpc;
  env.data_roots = options_.data_roots;
  env.checkpoint_roots = options_.checkpoint_roots;
  env.model_roots = options_.model_roots;
  env.clock = clock_;
  env.collective_timeout = options_.collective_timeout;
  env.emulated_speed = options_.emulated_speed;
  env.shared_memory_dir = options_.shared_memory_dir;
  env.shared_ring_bytes = static_cast<uint64_t>(options_.shared_memory_mib) << 20;
  env.place_outputs = options_.place_outputs;
  env.emulated_speed_source = &emulated_speed_;
  env.collective_store = [this](const v1::StageAssignment& assignment) {
    CoordinatorStore::Scope scope;
    {
      absl::MutexLock lock(&mu_);
      scope.worker_id = worker_id_;
      scope.session = session_;
    }
    scope.job_id = assignment.job_id();
    scope.attempt = assignment.attempt();
    scope.prefix = absl::StrCat("stage", assignment.stage(), "/");
    return c10::make_intrusive<CoordinatorStore>(
        coordinator_.get(), std::move(scope),
        std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.collective_timeout)));
  };
  return env;
}

// The stage-task thread: one stage command at a time, in the order the
// coordinator sent them.
void Worker::RunStageCommand(const v1::Command& command) {
  switch (command.command_case()) {
    case v1::Command::kConfigure:
      Configure(command.configure(), command.command_id());
      return;
    case v1::Command::kStart: {
      const std::vector<std::shared_ptr<StageRuntime>> all = runtimes();
      if (all.empty() || all.front()->job_id() != command.start().job_id()) {
        EmitError(
            command.start().job_id(), -1,
            absl::FailedPreconditionError("start for a job this worker is not configured for"));
        return;
      }
      // Every stage this worker holds; a multi-phase job goes on with its
      // next phase on the same runtimes.
      for (const auto& rt : all) {
        absl::Status s = rt->started() ? rt->ReleasePhase(command.start().phase(), /*strict=*/true)
                                       : rt->Start();
        // A replacing stage (recovery.replay) replays phases the job has
        // finished already: they need no go-ahead.
        if (s.ok()) s = rt->ReleasePhase(command.start().phase(), /*strict=*/false);
        if (!s.ok()) {
          EmitError(rt->job_id(), rt->stage(), s);
          return;
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kCheckpointSoon: {
      // Stage 0 of the attempt picks the step (StageRuntime::RequestCheckpoint);
      // anything else is stale and only acknowledged.
      const v1::CheckpointCommand& c = command.checkpoint_soon();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() == c.job_id() && rt->attempt() == c.attempt() && rt->stage() == 0 &&
            rt->running()) {
          STAGEWISE_LOG(INFO) << "job " << c.job_id() << ": checkpoint requested (" << c.reason()
                              << ")";
          rt->RequestCheckpoint();
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kNeighbourReplaced: {
      // recovery.replay: a neighbour of a stage here moved to another worker.
      const v1::NeighbourReplaced& r = command.neighbour_replaced();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() != r.job_id() || rt->attempt() != r.attempt() ||
            std::abs(rt->stage() - r.stage()) != 1) {
          continue;
        }
        STAGEWISE_LOG(INFO) << "job " << r.job_id() << ": stage " << r.stage() << " moved to "
                            << r.address() << "; reconnecting stage " << rt->stage();
        if (absl::Status s = rt->NeighbourReplaced(r); !s.ok()) {
          rt->Fail(absl::UnavailableError(s.message()));
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kCheckpointCommitted: {
      const v1::CheckpointCommitted& c = command.checkpoint_committed();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() == c.job_id() && rt->attempt() == c.attempt()) {
          rt->CheckpointCommitted(c.step());
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kReplicaRegroup: {
      // recovery.replay with replicas: a replica of a stage here was lost.
      const v1::ReplicaRegroup& r = command.replica_regroup();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() == r.job_id() && rt->attempt() == r.attempt() &&
            rt->stage() == r.stage()) {
          STAGEWISE_LOG(INFO) << "job " << r.job_id() << ": stage " << r.stage()
                              << " regroups its replicas as generation " << r.generation();
          rt->ReplicaRegroup(r);
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kStop: {
      std::shared_ptr<StageRuntime> rt = runtime();
      if (rt && rt->job_id() == command.stop().job_id()) {
        StopAll(absl::CancelledError(command.stop().reason()), false);
      }
      Ack(command.command_id());
      return;
    }
    default:
      return;
  }
}

}  // namespace stagewise::worker
