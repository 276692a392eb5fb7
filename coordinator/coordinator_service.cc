#include "coordinator/coordinator_service.h"

#include <string>

#include "absl/synchronization/mutex.h"
#include "services/common/log.h"
#include "services/rpc/outbox.h"
#include "services/rpc/status.h"

namespace stagewise::coordinator {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

// One worker's control stream: events in, commands out through an outbox.
class ControlReactor final : public grpc::ServerBidiReactor<v1::WorkerEvent, v1::Command>,
                             public CommandSink {
 public:
  // Commands are few and small (configure, start, stop per job); a worker that
  // stops reading misses heartbeats long before this many pile up.
  static constexpr size_t kOutboxCapacity = 1024;

  explicit ControlReactor(JobManager* manager)
      : manager_(manager),
        outbox_("control", kOutboxCapacity,
                {[this](const v1::Command* command) { StartWrite(command); },
                 [this](const absl::Status& status) { Finish(rpc::ToGrpcStatus(status)); }}) {
    StartRead(&event_);
  }

  bool Send(const v1::Command& command) override {
    absl::Status s = outbox_.TrySend(command);
    if (absl::IsResourceExhausted(s)) {
      STAGEWISE_LOG(WARNING) << "closing a control stream whose worker does not read: " << s;
      outbox_.Close(absl::ResourceExhaustedError("the worker does not read its commands"));
    }
    return s.ok();
  }

  void Close(const absl::Status& status) override { outbox_.Close(status); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Close(absl::OkStatus());
      return;
    }
    if (worker_id_.empty()) {
      worker_id_ = event_.worker_id();
      if (absl::Status s = manager_->Connect(worker_id_, this); !s.ok()) {
        worker_id_.clear();
        Close(s);
        return;
      }
    }
    manager_->OnEvent(event_);
    StartRead(&event_);
  }

  void OnWriteDone(bool ok) override { outbox_.OnWriteDone(ok); }

  void OnCancel() override { Close(absl::CancelledError("the worker went away")); }

  void OnDone() override {
    outbox_.OnDone(absl::OkStatus());
    if (!worker_id_.empty()) {
      manager_->Disconnect(worker_id_, this, absl::UnavailableError("control stream ended"));
    }
    delete this;
  }

 private:
  JobManager* manager_;
  // Touched only by reactions on the read side (one read in flight at a time).
  v1::WorkerEvent event_;
  std::string worker_id_;
  rpc::Outbox<v1::Command> outbox_;
};

bool Terminal(const v1::JobEvent& e) { return IsTerminal(e.status().state()); }

// Streams a job's events. Progress events that arrive while a write is in
// flight replace each other (the outbox holds the one in flight plus at most
// one waiting), so a slow client never holds the coordinator back; the
// terminal event is always delivered, then the stream finishes.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(JobManager* manager, const std::string& job_id)
      : manager_(manager),
        outbox_("watch", /*capacity=*/2,
                {[this](const v1::JobEvent* event) { StartWrite(event); },
                 [this](const absl::Status& status) { Finish(rpc::ToGrpcStatus(status)); }}) {
    // OnDone unsubscribes: no Finish until the subscription is known, even if
    // the listener delivers the terminal event from inside Subscribe.
    outbox_.AcquireHold();
    auto sub = manager_->Subscribe(job_id, [this](const v1::JobEvent& e) { Push(e); });
    if (sub.ok()) {
      absl::MutexLock lock(&mu_);
      subscription_ = *sub;
    } else {
      outbox_.Close(sub.status());
    }
    outbox_.ReleaseHold();
  }

  void OnWriteDone(bool ok) override { outbox_.OnWriteDone(ok); }

  void OnCancel() override { outbox_.Close(absl::CancelledError("the watcher went away")); }

  void OnDone() override {
    outbox_.OnDone(absl::OkStatus());
    int64_t sub = 0;
    {
      absl::MutexLock lock(&mu_);
      sub = subscription_;
    }
    if (sub != 0) manager_->Unsubscribe(sub);
    delete this;
  }

 private:
  // The job manager's listener: never blocks.
  void Push(const v1::JobEvent& e) {
    // One event at a time, so nothing replaces the terminal event before the
    // outbox is closed behind it.
    absl::MutexLock lock(&mu_);
    if (!outbox_.TrySendOrReplace(e).ok()) return;  // closed: nothing more to say
    if (Terminal(e)) outbox_.Close(absl::OkStatus());
  }

  JobManager* manager_;
  absl::Mutex mu_;
  int64_t subscription_ ABSL_GUARDED_BY(mu_) = 0;
  rpc::Outbox<v1::JobEvent> outbox_;
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(
    grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  auto r = manager_->Register(request->worker());
  if (r.ok()) *response = *r;
  return Done(ctx, r.status());
}

grpc::ServerBidiReactor<v1::WorkerEvent, v1::Command>* CoordinatorService::Control(
    grpc::CallbackServerContext*) {
  return new ControlReactor(manager_);
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                        const v1::SubmitJobRequest* request,
                                                        v1::SubmitJobResponse* response) {
  auto id = manager_->Submit(request->job_spec_yaml());
  if (id.ok()) response->set_job_id(*id);
  return Done(ctx, id.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* ctx,
                                                     const v1::GetJobRequest* request,
                                                     v1::JobStatus* response) {
  auto st = manager_->GetJob(request->job_id());
  if (st.ok()) *response = *st;
  return Done(ctx, st.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* ctx,
                                                       const v1::ListJobsRequest* request,
                                                       v1::ListJobsResponse* response) {
  auto jobs = manager_->ListJobs(request->limit());
  if (jobs.ok()) {
    for (auto& j : *jobs) *response->add_jobs() = std::move(j);
  }
  return Done(ctx, jobs.status());
}

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorService::WatchJob(
    grpc::CallbackServerContext*, const v1::WatchJobRequest* request) {
  return new WatchReactor(manager_, request->job_id());
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* ctx,
                                                        const v1::CancelJobRequest* request,
                                                        v1::JobStatus* response) {
  auto st = manager_->Cancel(request->job_id(), request->reason());
  if (st.ok()) *response = *st;
  return Done(ctx, st.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                          const v1::ListWorkersRequest*,
                                                          v1::ListWorkersResponse* response) {
  for (auto& w : manager_->ListWorkers()) *response->add_workers() = std::move(w);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  // Reads checkpoint.dir (directory listings and stats, no shard contents).
  auto listing = manager_->ListCheckpoints(request->job_id());
  if (listing.ok()) *response = std::move(*listing);
  return Done(ctx, listing.status());
}

}  // namespace stagewise::coordinator
