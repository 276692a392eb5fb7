#include "worker/worker.h"

#include <unistd.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/log.h"
#include "services/profiler/profiler.h"
#include "services/rpc/status.h"

namespace stagewise::worker {

namespace {

// An Exchange call refused before it starts: finishes with `status` at once.
class RefusedExchange : public grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage> {
 public:
  explicit RefusedExchange(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

class Worker::Service : public v1::StageService::CallbackService {
 public:
  Service(Worker* worker, int max_streams)
      : worker_(worker), open_(std::make_shared<std::atomic<int>>(0)), max_streams_(max_streams) {}
  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext*) override {
    // A slot per open stream, given back when the stream is destroyed.
    if (open_->fetch_add(1) >= max_streams_) {
      open_->fetch_sub(1);
      return new RefusedExchange(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                              absl::StrCat("this worker already has ", max_streams_,
                                                           " stage streams open (--max-streams)")));
    }
    std::shared_ptr<void> slot(nullptr, [open = open_](void*) { open->fetch_sub(1); });
    return UpstreamStream::Start(
        [this, slot](const v1::StageMessage& first, std::shared_ptr<UpstreamStream> stream,
                     MessageSink** sink) { return worker_->Route(first, std::move(stream), sink); },
        /*outbox_capacity=*/16);
  }

 private:
  Worker* worker_;
  std::shared_ptr<std::atomic<int>> open_;
  const int max_streams_;
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

  service_ = std::make_unique<Service>(this, options_.max_streams);
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
  return absl::OkStatus();
}

void Worker::Shutdown() {
  if (shutdown_.exchange(true)) return;
  const absl::Time start = absl::Now();
  auto phase = [&](const char* what) {
    STAGEWISE_LOG(INFO) << "shutdown: " << what << " after "
                        << absl::FormatDuration(absl::Now() - start);
  };
  std::shared_ptr<StageRuntime> rt;
  {
    absl::MutexLock lock(&mu_);
    rt = runtime_;
    if (control_context_ != nullptr) control_context_->TryCancel();
  }
  if (rt) {
    rt->Stop(absl::CancelledError("the worker is shutting down"));
    rt->Join();
    phase("stage stopped");
  }
  if (control_thread_.joinable()) control_thread_.join();
  phase("control stream closed");
  if (profile_thread_.joinable()) profile_thread_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  phase("server stopped");
}

std::shared_ptr<StageRuntime> Worker::runtime() const {
  absl::MutexLock lock(&mu_);
  return runtime_;
}

bool Worker::registered() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

void Worker::ControlLoop() {
  // Exponential backoff while the coordinator stays away (restarting,
  // rescheduled); back to the shortest delay once a session was established.
  absl::Duration delay = options_.reconnect;
  while (!shutdown_) {
    bool established = false;
    absl::Status s = ControlSession(&established);
    if (shutdown_) break;
    if (established) delay = options_.reconnect;
    STAGEWISE_LOG(WARNING) << "control session ended: " << s << "; reconnecting in "
                           << absl::FormatDuration(delay);
    for (absl::Duration slept; slept < delay && !shutdown_; slept += absl::Milliseconds(50)) {
      absl::SleepFor(absl::Milliseconds(50));
    }
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
  info->set_version(STAGEWISE_VERSION);
  v1::RegisterWorkerResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = coordinator_->RegisterWorker(&ctx, req, &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s);
  }
  grpc::ClientContext ctx;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::CancelledError("shutting down");
    worker_id_ = resp.worker_id();
    control_context_ = &ctx;
  }
  auto stream = coordinator_->Control(&ctx);
  {
    absl::MutexLock lock(&write_mu_);
    control_stream_ = stream.get();
  }
  {
    absl::MutexLock lock(&mu_);
    connected_ = true;
  }
  *established = true;
  v1::WorkerEvent hello;
  hello.set_session(resp.session());  // opens the stream in this registration's name
  hello.mutable_heartbeat()->set_unix_ms(absl::ToUnixMillis(absl::Now()));
  hello.mutable_heartbeat()->set_probe_unix_us(ClockSync::NowUs());
  Emit(hello);
  std::atomic<bool> session_over{false};
  const absl::Duration beat = resp.heartbeat_interval_ms() > 0
                                  ? absl::Milliseconds(resp.heartbeat_interval_ms())
                                  : options_.heartbeat;
  std::thread heartbeat([&] {
    // Every heartbeat probes the clock; the first few follow each other
    // quickly, so that a job started right away has a good offset estimate.
    for (int beats = 0; !session_over; ++beats) {
      const absl::Duration wait = beats < 8 ? std::min(beat, absl::Milliseconds(50)) : beat;
      for (absl::Duration slept; slept < wait && !session_over; slept += absl::Milliseconds(50)) {
        absl::SleepFor(std::min(wait, absl::Milliseconds(50)));
      }
      if (session_over) break;
      v1::WorkerEvent e;
      e.mutable_heartbeat()->set_unix_ms(absl::ToUnixMillis(absl::Now()));
      e.mutable_heartbeat()->set_probe_unix_us(ClockSync::NowUs());
      Emit(e);
    }
  });
  v1::Command command;
  while (stream->Read(&command)) HandleCommand(command);
  session_over = true;
  heartbeat.join();
  {
    absl::MutexLock lock(&write_mu_);
    control_stream_ = nullptr;
  }
  std::shared_ptr<StageRuntime> rt;
  {
    absl::MutexLock lock(&mu_);
    connected_ = false;
    control_context_ = nullptr;
    rt = runtime_;
  }
  grpc::Status status = stream->Finish();
  // Without its coordinator a job cannot finish; the coordinator re-plans it.
  if (rt && rt->running()) {
    rt->Stop(absl::UnavailableError("lost the coordinator"));
    rt->Join();
  }
  return rpc::FromGrpcStatus(status);
}

void Worker::Emit(v1::WorkerEvent event) {
  {
    absl::MutexLock lock(&mu_);
    event.set_worker_id(worker_id_);
  }
  absl::MutexLock lock(&write_mu_);
  if (control_stream_ != nullptr) control_stream_->Write(event);
}

void Worker::HandleCommand(const v1::Command& command) {
  auto ack = [&]() {
    v1::WorkerEvent e;
    e.mutable_ack()->set_command_id(command.command_id());
    Emit(e);
  };
  auto error = [&](const std::string& job, int stage, const absl::Status& s, int attempt = -1) {
    v1::WorkerEvent e;
    auto* err = e.mutable_error();
    err->set_job_id(job);
    err->set_stage(stage);
    if (attempt < 0) {
      std::shared_ptr<StageRuntime> rt = runtime();
      attempt = rt && rt->job_id() == job ? rt->attempt() : 0;
    }
    err->set_attempt(attempt);
    err->set_retryable(absl::IsUnavailable(s) || absl::IsAborted(s) || absl::IsDeadlineExceeded(s));
    err->set_code(static_cast<int>(s.code()));
    err->set_message(absl::StrCat("stage ", stage, " (", address(), "): ", s.message()));
    Emit(e);
  };
  switch (command.command_case()) {
    case v1::Command::kConfigure: {
      const v1::StageAssignment& a = command.configure();
      std::shared_ptr<StageRuntime> old = runtime();
      if (old && old->running()) {
        if (old->job_id() != a.job_id()) {
          error(a.job_id(), a.stage(),
                absl::FailedPreconditionError(absl::StrCat("busy with job ", old->job_id())),
                a.attempt());
          return;
        }
        // A new attempt of the job this worker still runs (the coordinator
        // recovered it): the old attempt is over.
        old->Stop(absl::AbortedError(absl::StrCat("superseded by attempt ", a.attempt())));
        old->Join();
      }
      RuntimeEnv env;
      env.device = device_;
      env.registry = &metrics_->registry();
      env.emit = [this](v1::WorkerEvent e) { Emit(std::move(e)); };
      env.rpc = options_.rpc;
      env.data_roots = options_.data_roots;
      env.checkpoint_roots = options_.checkpoint_roots;
      env.model_roots = options_.model_roots;
      env.clock = clock_;
      auto rt = StageRuntime::Create(a, std::move(env));
      if (!rt.ok()) {
        error(a.job_id(), a.stage(), rt.status(), a.attempt());
        return;
      }
      {
        absl::MutexLock lock(&mu_);
        runtime_ = *rt;
      }
      ack();
      return;
    }
    case v1::Command::kStart: {
      std::shared_ptr<StageRuntime> rt = runtime();
      if (!rt || rt->job_id() != command.start().job_id()) {
        error(command.start().job_id(), -1,
              absl::FailedPreconditionError("start for a job this worker is not configured for"));
        return;
      }
      if (rt->started()) {
        // A multi-phase job goes on with its next phase on the same runtime.
        if (absl::Status s = rt->BeginPhase(command.start().phase()); !s.ok()) {
          error(rt->job_id(), rt->stage(), s);
          return;
        }
        ack();
        return;
      }
      if (absl::Status s = rt->Start(); !s.ok()) {
        error(rt->job_id(), rt->stage(), s);
        return;
      }
      ack();
      return;
    }
    case v1::Command::kProfile: {
      // Profiling takes seconds to minutes: off the control thread, one at a time.
      if (profile_thread_.joinable()) profile_thread_.join();
      profile_thread_ = std::thread([this, c = command.profile()] { Profile(c); });
      ack();
      return;
    }
    case v1::Command::kStop: {
      std::shared_ptr<StageRuntime> rt = runtime();
      if (rt && rt->job_id() == command.stop().job_id()) {
        rt->Stop(absl::CancelledError(command.stop().reason()));
        rt->Join();
      }
      ack();
      return;
    }
    case v1::Command::kClock:  // the answer to a heartbeat's probe; not acknowledged
      clock_->AddSample(command.clock().probe_unix_us(), command.clock().coordinator_unix_us(),
                        ClockSync::NowUs());
      return;
    case v1::Command::COMMAND_NOT_SET:
      ack();  // nothing to do; an empty command is still acknowledged
  }
}

void Worker::Profile(const v1::ProfileCommand& command) {
  auto fail = [&](const absl::Status& s) {
    v1::WorkerEvent e;
    auto* err = e.mutable_error();
    err->set_job_id(command.job_id());
    err->set_stage(-1);
    err->set_code(static_cast<int>(s.code()));
    err->set_message(absl::StrCat("profiling on ", address(), ": ", s.message()));
    Emit(e);
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
  auto* r = e.mutable_profile();
  r->set_job_id(command.job_id());
  r->set_profile(planner::SerializeProfile(*profile));
  r->set_cached(cached);
  Emit(e);
}

absl::Status Worker::Route(const v1::StageMessage& first, std::shared_ptr<UpstreamStream> stream,
                           MessageSink** sink) {
  std::shared_ptr<StageRuntime> rt = runtime();
  if (!rt || rt->job_id() != first.job_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("StageMessage.job_id: this worker runs no stage of job '",
                     first.job_id().substr(0, 64), first.job_id().size() > 64 ? "...'" : "'"));
  }
  return rt->AttachUpstream(first, std::move(stream), sink);
}

}  // namespace stagewise::worker
