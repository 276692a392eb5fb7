#include "coordinator/coordinator_service.h"

#include <deque>

#include "absl/synchronization/mutex.h"
#include "services/rpc/status.h"

namespace stagewise::coordinator {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

// One worker's control stream: events in, commands out (one write in flight).
class ControlReactor final : public grpc::ServerBidiReactor<v1::WorkerEvent, v1::Command>,
                             public CommandSink {
 public:
  explicit ControlReactor(JobManager* manager) : manager_(manager) { StartRead(&event_); }

  bool Send(const v1::Command& command) override {
    const v1::Command* start = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return false;
      // Commands are few and small (configure, start, stop per job): the
      // queue stays short; a worker that stops reading misses heartbeats first.
      outbox_.push_back(command);
      if (!writing_) {
        writing_ = true;
        start = &outbox_.front();
      }
    }
    if (start != nullptr) StartWrite(start);
    return true;
  }

  void Close(const absl::Status& status) override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return;
      closing_ = true;
      status_ = status;
      finish = !writing_;
      finish_started_ = finish;
    }
    if (finish) Finish(rpc::ToGrpcStatus(status));
  }

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

  void OnWriteDone(bool ok) override {
    const v1::Command* next = nullptr;
    bool finish = false;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      outbox_.pop_front();
      if (!ok) {
        outbox_.clear();
        closing_ = true;
      }
      if (!outbox_.empty()) {
        next = &outbox_.front();
      } else {
        writing_ = false;
        if (closing_ && !finish_started_) {
          finish_started_ = finish = true;
          status = status_;
        }
      }
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(rpc::ToGrpcStatus(status));
  }

  void OnCancel() override { Close(absl::CancelledError("the worker went away")); }

  void OnDone() override {
    if (!worker_id_.empty()) {
      manager_->Disconnect(worker_id_, this, absl::UnavailableError("control stream ended"));
    }
    delete this;
  }

 private:
  JobManager* manager_;
  v1::WorkerEvent event_;
  std::string worker_id_;
  absl::Mutex mu_;
  std::deque<v1::Command> outbox_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

bool Terminal(const v1::JobEvent& e) { return IsTerminal(e.status().state()); }

// Streams a job's events. Progress events that arrive while a write is in
// flight replace each other (bounded: at most one waiting), so a slow client
// never holds the coordinator back; the terminal event is always delivered.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(JobManager* manager, const std::string& job_id) : manager_(manager) {
    auto sub = manager_->Subscribe(job_id, [this](const v1::JobEvent& e) { Push(e); });
    if (!sub.ok()) {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(rpc::ToGrpcStatus(sub.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    subscription_ = *sub;
    if (done_sending_ && !writing_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status::CANCELLED);
      }
      return;
    }
    StartNextLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (!finished_ && !writing_) {
      finished_ = true;
      Finish(grpc::Status::CANCELLED);
    }
    cancelled_ = true;
  }

  void OnDone() override {
    int64_t sub = 0;
    {
      absl::MutexLock lock(&mu_);
      sub = subscription_;
    }
    if (sub != 0) manager_->Unsubscribe(sub);
    delete this;
  }

 private:
  void Push(const v1::JobEvent& e) {
    absl::MutexLock lock(&mu_);
    if (done_sending_ || finished_) return;
    waiting_ = e;
    has_waiting_ = true;
    if (Terminal(e)) done_sending_ = true;
    if (!writing_) StartNextLocked();
  }

  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (cancelled_) {
      finished_ = true;
      Finish(grpc::Status::CANCELLED);
      return;
    }
    if (has_waiting_) {
      current_ = waiting_;
      has_waiting_ = false;
      writing_ = true;
      StartWrite(&current_);
      return;
    }
    if (done_sending_ && subscription_ != 0) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  JobManager* manager_;
  absl::Mutex mu_;
  v1::JobEvent current_ ABSL_GUARDED_BY(mu_);
  v1::JobEvent waiting_ ABSL_GUARDED_BY(mu_);
  bool has_waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_sending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t subscription_ ABSL_GUARDED_BY(mu_) = 0;
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

}  // namespace stagewise::coordinator
