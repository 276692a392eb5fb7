#include "coordinator/coordinator_service.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/common/log.h"
#include "services/common/version.h"
#include "services/rpc/outbox.h"
#include "services/rpc/status.h"
#include "services/rpc/tls.h"

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

  ControlReactor(JobManager* manager, std::string identity, absl::Status authorized)
      : manager_(manager),
        identity_(std::move(identity)),
        outbox_("control", kOutboxCapacity,
                {[this](const v1::Command* command) { StartWrite(command); },
                 [this](const absl::Status& status) { Finish(rpc::ToGrpcStatus(status)); }}) {
    if (!authorized.ok()) {
      outbox_.Close(authorized);
      return;
    }
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
      // Workers never half-close their control stream: the read failed on a
      // frame that is not a WorkerEvent (or the worker went away, and then
      // nobody reads this status).
      Close(absl::InvalidArgumentError(
          "the control stream ended: a malformed WorkerEvent, or the worker half-closed it"));
      return;
    }
    if (worker_id_.empty()) {
      if (absl::Status s = manager_->Connect(event_.worker_id(), event_.session(), this,
                                             {.identity = identity_});
          !s.ok()) {
        Close(s);
        return;
      }
      worker_id_ = event_.worker_id();
    } else if (!event_.worker_id().empty() && event_.worker_id() != worker_id_) {
      // One stream, one worker: an event in another worker's name ends it.
      Close(absl::PermissionDeniedError(absl::StrCat("WorkerEvent.worker_id: '", event_.worker_id(),
                                                     "' on the control stream of '", worker_id_,
                                                     "'")));
      return;
    }
    event_.set_worker_id(worker_id_);
    event_.clear_session();
    if (event_.has_heartbeat() && event_.heartbeat().probe_unix_us() != 0) {
      // The worker's clock probe: answered at once, from here, so the round
      // trip measures the stream and not the job manager's loop.
      v1::Command reply;
      reply.mutable_clock()->set_probe_unix_us(event_.heartbeat().probe_unix_us());
      reply.mutable_clock()->set_coordinator_unix_us(absl::ToUnixMicros(absl::Now()));
      Send(reply);
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
  const std::string identity_;  // the peer's certificate identity ("" in plaintext)
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
  WatchReactor(JobManager* manager, const std::string& job_id, const absl::Status& authorized)
      : manager_(manager),
        outbox_("watch", /*capacity=*/2,
                {[this](const v1::JobEvent* event) { StartWrite(event); },
                 [this](const absl::Status& status) { Finish(rpc::ToGrpcStatus(status)); }}) {
    // OnDone unsubscribes: no Finish until the subscription is known, even if
    // the listener delivers the terminal event from inside Subscribe.
    if (!authorized.ok()) {
      outbox_.Close(authorized);
      return;
    }
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

// BackupDatabase: the copy is made on a thread of its own (it may take a
// while and must not hold a gRPC callback thread), then streamed a chunk at a
// time, one write in flight; the temporary file goes when the call is done.
class BackupReactor final : public grpc::ServerWriteReactor<v1::DatabaseChunk> {
 public:
  BackupReactor(JobManager* manager, const absl::Status& authorized) {
    if (!authorized.ok()) {
      Finish(rpc::ToGrpcStatus(authorized));
      return;
    }
    static std::atomic<uint64_t> backups{0};
    path_ = (std::filesystem::temp_directory_path() /
             absl::StrCat("stagewise-backup-", ::getpid(), "-", backups.fetch_add(1), ".db"))
                .string();
    copier_ = std::thread([this, manager] {
      absl::Status copied = manager->BackupDatabase(path_);
      if (!copied.ok()) {
        Finish(rpc::ToGrpcStatus(copied));
        return;
      }
      in_.open(path_, std::ios::binary);
      std::error_code ec;
      total_ = static_cast<int64_t>(std::filesystem::file_size(path_, ec));
      if (!in_ || ec) {
        Finish(rpc::ToGrpcStatus(absl::InternalError("reading the database copy failed")));
        return;
      }
      NextChunk();
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    NextChunk();
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    if (copier_.joinable()) copier_.join();
    in_.close();
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove(path_, ec);
    delete this;
  }

 private:
  void NextChunk() {
    if (cancelled_) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    std::string* data = chunk_.mutable_data();
    data->resize(1 << 20);
    in_.read(data->data(), static_cast<std::streamsize>(data->size()));
    data->resize(static_cast<size_t>(in_.gcount()));
    if (data->empty()) {
      Finish(in_.eof() ? grpc::Status::OK
                       : rpc::ToGrpcStatus(absl::InternalError("reading the copy failed")));
      return;
    }
    chunk_.set_total_bytes(total_);
    StartWrite(&chunk_);
  }

  std::string path_;
  std::thread copier_;
  std::ifstream in_;
  int64_t total_ = 0;
  std::atomic<bool> cancelled_{false};
  v1::DatabaseChunk chunk_;  // the write in flight
};

}  // namespace

absl::StatusOr<rpc::Principal> CoordinatorService::Authorize(grpc::CallbackServerContext* ctx,
                                                             rpc::Role needed) const {
  const auto& metadata = ctx->client_metadata();
  // A client of another version line would misread (or be misread by) this
  // coordinator: refused, naming both versions. Clients that do not say
  // (older ones, grpcurl) are let through.
  if (auto it = metadata.find(kVersionMetadataKey); it != metadata.end()) {
    absl::Status compatible =
        CheckPeerVersion(absl::string_view(it->second.data(), it->second.size()), "this client");
    if (!compatible.ok()) {
      manager_->metrics()->CountRefused("version");
      return compatible;
    }
  }
  std::shared_ptr<const rpc::TokenTable> reloaded;  // the table in force for this call
  if (policy_.token_file != nullptr) reloaded = policy_.token_file->table();
  const rpc::TokenTable* tokens = reloaded ? reloaded.get() : policy_.tokens;
  if (tokens == nullptr) return rpc::Principal{"anonymous", rpc::Role::kAdmin};
  std::string header;
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    header.assign(it->second.data(), it->second.size());
  }
  auto principal = tokens->Authenticate(header);
  if (!principal.ok()) {
    manager_->metrics()->CountRefused("unauthenticated");
    return principal.status();
  }
  if (!rpc::HasRole(*principal, needed)) {
    manager_->metrics()->CountRefused("permission_denied");
    return absl::PermissionDeniedError(absl::StrCat(
        "token '", principal->name, "' has role ", std::string(rpc::RoleName(principal->role)),
        "; this needs ", std::string(rpc::RoleName(needed))));
  }
  return principal;
}

absl::Status CoordinatorService::AuthorizeWorker(grpc::CallbackServerContext* ctx) const {
  if (!policy_.require_worker_identity) return absl::OkStatus();
  const std::string identity = rpc::PeerIdentity(*ctx->auth_context());
  if (rpc::IsWorkerIdentity(identity)) return absl::OkStatus();
  manager_->metrics()->CountRefused("permission_denied");
  return absl::PermissionDeniedError(
      absl::StrCat("certificate '", identity,
                   "' is not a worker's (worker certificates have the Common Name worker, "
                   "worker-* or worker.*)"));
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(
    grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  if (absl::Status s = AuthorizeWorker(ctx); !s.ok()) return Done(ctx, s);
  auto r =
      manager_->Register(request->worker(), {.identity = rpc::PeerIdentity(*ctx->auth_context())});
  if (r.ok()) *response = *r;
  return Done(ctx, r.status());
}

grpc::ServerUnaryReactor* CoordinatorService::CollectiveStore(
    grpc::CallbackServerContext* ctx, const v1::CollectiveStoreRequest* request,
    v1::CollectiveStoreResponse* response) {
  if (absl::Status s = AuthorizeWorker(ctx); !s.ok()) return Done(ctx, s);
  return Done(ctx, manager_->CollectiveStore(
                       *request, {.identity = rpc::PeerIdentity(*ctx->auth_context())}, response));
}

grpc::ServerBidiReactor<v1::WorkerEvent, v1::Command>* CoordinatorService::Control(
    grpc::CallbackServerContext* ctx) {
  return new ControlReactor(manager_, rpc::PeerIdentity(*ctx->auth_context()),
                            AuthorizeWorker(ctx));
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* ctx,
                                                        const v1::SubmitJobRequest* request,
                                                        v1::SubmitJobResponse* response) {
  auto caller = Authorize(ctx, rpc::Role::kSubmit);
  if (!caller.ok()) return Done(ctx, caller.status());
  auto id = manager_->Submit(request->job_spec_yaml(), caller->name, request->suspended());
  if (id.ok()) response->set_job_id(*id);
  return Done(ctx, id.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* ctx,
                                                     const v1::GetJobRequest* request,
                                                     v1::JobStatus* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  auto st = manager_->GetJob(request->job_id());
  if (st.ok()) *response = *st;
  return Done(ctx, st.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* ctx,
                                                       const v1::ListJobsRequest* request,
                                                       v1::ListJobsResponse* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  if (request->page_size() < 0 || request->limit() < 0) {
    return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                         request->page_size() < 0 ? "page_size" : "limit", ": must be >= 0")));
  }
  int page_size = request->page_size() > 0 ? request->page_size() : request->limit();
  if (page_size == 0) page_size = kDefaultJobsPage;
  page_size = std::min(page_size, kMaxJobsPage);
  auto page = manager_->ListJobsPage(page_size, request->page_token(), kMaxJobsPageBytes);
  if (page.ok()) {
    for (auto& j : page->jobs) *response->add_jobs() = std::move(j);
    response->set_next_page_token(page->next_page_token);
  }
  return Done(ctx, page.status());
}

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorService::WatchJob(
    grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* request) {
  auto caller = Authorize(ctx, rpc::Role::kRead);
  return new WatchReactor(manager_, request->job_id(), caller.status());
}

absl::StatusOr<rpc::Principal> CoordinatorService::AuthorizeOwner(grpc::CallbackServerContext* ctx,
                                                                  const std::string& job_id,
                                                                  const char* verb) {
  auto caller = Authorize(ctx, rpc::Role::kSubmit);
  if (!caller.ok() || caller->role == rpc::Role::kAdmin) return caller;
  // A submitter acts only on its own jobs (an external queue holds admin).
  auto st = manager_->GetJob(job_id);
  if (!st.ok()) return st.status();
  if (!rpc::CanCancel(*caller, st->owner())) {
    manager_->metrics()->CountRefused("permission_denied");
    return absl::PermissionDeniedError(absl::StrCat("token '", caller->name, "' may ", verb,
                                                    " only its own jobs; job ", job_id,
                                                    " was submitted by '", st->owner(), "'"));
  }
  return caller;
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* ctx,
                                                        const v1::CancelJobRequest* request,
                                                        v1::JobStatus* response) {
  auto caller = AuthorizeOwner(ctx, request->job_id(), "cancel");
  if (!caller.ok()) return Done(ctx, caller.status());
  auto st = manager_->Cancel(request->job_id(), request->reason());
  if (st.ok()) *response = *st;
  return Done(ctx, st.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ResumeJob(grpc::CallbackServerContext* ctx,
                                                        const v1::ResumeJobRequest* request,
                                                        v1::JobStatus* response) {
  auto caller = AuthorizeOwner(ctx, request->job_id(), "resume");
  if (!caller.ok()) return Done(ctx, caller.status());
  auto st = manager_->Release(request->job_id());
  if (st.ok()) *response = *st;
  return Done(ctx, st.status());
}

grpc::ServerUnaryReactor* CoordinatorService::SetJobPriority(
    grpc::CallbackServerContext* ctx, const v1::SetJobPriorityRequest* request,
    v1::JobStatus* response) {
  auto caller = AuthorizeOwner(ctx, request->job_id(), "change the priority of");
  if (!caller.ok()) return Done(ctx, caller.status());
  auto st = manager_->SetPriority(request->job_id(), request->priority());
  if (st.ok()) *response = *st;
  return Done(ctx, st.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* ctx,
                                                          const v1::ListWorkersRequest*,
                                                          v1::ListWorkersResponse* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  for (auto& w : manager_->ListWorkers()) *response->add_workers() = std::move(w);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  // Reads checkpoint.dir (directory listings and stats, no shard contents).
  auto listing = manager_->ListCheckpoints(request->job_id());
  if (listing.ok()) *response = std::move(*listing);
  return Done(ctx, listing.status());
}

grpc::ServerWriteReactor<v1::DatabaseChunk>* CoordinatorService::BackupDatabase(
    grpc::CallbackServerContext* ctx, const v1::BackupDatabaseRequest*) {
  auto caller = Authorize(ctx, rpc::Role::kAdmin);
  return new BackupReactor(manager_, caller.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobEvents(grpc::CallbackServerContext* ctx,
                                                            const v1::ListJobEventsRequest* request,
                                                            v1::ListJobEventsResponse* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  auto events = manager_->JobEvents(request->job_id());
  if (events.ok()) *response = std::move(*events);
  return Done(ctx, events.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetJobMetrics(grpc::CallbackServerContext* ctx,
                                                            const v1::GetJobMetricsRequest* request,
                                                            v1::JobMetrics* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  if (request->names_size() > 64 || request->max_points() < 0 || request->max_points() > 100000) {
    return Done(ctx, absl::InvalidArgumentError(
                         "GetJobMetricsRequest: at most 64 names and max_points in [0, 100000]"));
  }
  std::vector<std::string> names(request->names().begin(), request->names().end());
  auto metrics = manager_->JobMetrics(request->job_id(), names, request->max_points());
  if (metrics.ok()) *response = std::move(*metrics);
  return Done(ctx, metrics.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetJobTrace(grpc::CallbackServerContext* ctx,
                                                          const v1::GetJobTraceRequest* request,
                                                          v1::JobTrace* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  auto trace = manager_->JobTrace(request->job_id());
  if (trace.ok()) *response = std::move(*trace);
  return Done(ctx, trace.status());
}

grpc::ServerUnaryReactor* CoordinatorService::GetGoodput(grpc::CallbackServerContext* ctx,
                                                         const v1::GetGoodputRequest* request,
                                                         v1::Goodput* response) {
  if (auto caller = Authorize(ctx, rpc::Role::kRead); !caller.ok()) {
    return Done(ctx, caller.status());
  }
  auto goodput = manager_->Goodput(request->job_id());
  if (goodput.ok()) *response = std::move(*goodput);
  return Done(ctx, goodput.status());
}

}  // namespace stagewise::coordinator
