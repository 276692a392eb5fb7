#include "clients/client/coordinator_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "services/common/retry_policy.h"
#include "services/common/version.h"
#include "services/rpc/server.h"
#include "services/rpc/status.h"

namespace stagewise::client {

std::string ResolveCoordinatorAddress(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  const char* env = std::getenv(kCoordinatorEnvVar);
  if (env != nullptr && env[0] != '\0') return env;
  return kDefaultCoordinatorAddress;
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

absl::Duration Backoff::Next() {
  next_ = next_ <= absl::ZeroDuration() ? initial_ : std::min(next_ * 2, max_);
  return Jittered(next_, gen_);
}

bool IsReconnectable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

std::string JobStateName(v1::JobState state) {
  const std::string& name = v1::JobState_Name(state);
  return name.empty() ? absl::StrCat("STATE_", static_cast<int>(state)) : name;
}

namespace {
absl::Mutex default_options_mu(absl::kConstInit);
rpc::RpcOptions& DefaultOptionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(default_options_mu) {
  static auto* options = new rpc::RpcOptions();
  return *options;
}
}  // namespace

void SetDefaultClientOptions(const rpc::RpcOptions& options) {
  absl::MutexLock lock(&default_options_mu);
  DefaultOptionsLocked() = options;
}

rpc::RpcOptions DefaultClientOptions() {
  absl::MutexLock lock(&default_options_mu);
  return DefaultOptionsLocked();
}

CoordinatorClient::CoordinatorClient(const std::string& address, absl::Duration deadline,
                                     const rpc::RpcOptions& options)
    : address_(address),
      deadline_(deadline),
      token_(options.bearer_token),
      version_(options.client_version.empty() ? Version() : options.client_version),
      options_(options),
      channel_(rpc::MakeChannel(address, options)),
      stub_(v1::Coordinator::NewStub(channel_)) {}

CoordinatorClient::~CoordinatorClient() = default;

void CoordinatorClient::SetDeadline(grpc::ClientContext* ctx) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  AddToken(ctx);
}

void CoordinatorClient::AddToken(grpc::ClientContext* ctx) const {
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  // The coordinator refuses a client of another version line by name.
  if (!version_.empty()) ctx->AddMetadata(kVersionMetadataKey, version_);
}

std::string CoordinatorClient::UnreachableHint() const {
  return absl::StrCat("cannot reach the coordinator at ", address_,
                      " (is it running? set --coordinator or STAGEWISE_COORDINATOR): ");
}

absl::Status CoordinatorClient::Convert(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // A coordinator that answers may itself say UNAVAILABLE (e.g. shutting
  // down); only a channel that never got connected means "nobody is there".
  const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/false);
  const bool connected = state == GRPC_CHANNEL_READY;
  const bool unreachable = (status.error_code() == grpc::StatusCode::UNAVAILABLE && !connected) ||
                           (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                            !connected && state != GRPC_CHANNEL_IDLE);
  if (unreachable) {
    return absl::UnavailableError(absl::StrCat(UnreachableHint(), status.error_message()));
  }
  return rpc::FromGrpcStatus(status);
}

absl::StatusOr<std::string> CoordinatorClient::Submit(const std::string& job_spec_yaml,
                                                      bool suspended) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::SubmitJobRequest req;
  req.set_suspended(suspended);
  req.set_job_spec_yaml(job_spec_yaml);
  v1::SubmitJobResponse resp;
  if (absl::Status s = Convert(stub_->SubmitJob(&ctx, req, &resp)); !s.ok()) return s;
  if (resp.job_id().empty()) {
    return absl::InternalError("the coordinator accepted the job but returned no job id");
  }
  return resp.job_id();
}

absl::StatusOr<v1::JobStatus> CoordinatorClient::GetJob(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::JobStatus resp;
  if (absl::Status s = Convert(stub_->GetJob(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::JobMetrics> CoordinatorClient::GetJobMetrics(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetJobMetricsRequest req;
  req.set_job_id(job_id);
  v1::JobMetrics resp;
  if (absl::Status s = Convert(stub_->GetJobMetrics(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::JobTrace> CoordinatorClient::GetJobTrace(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetJobTraceRequest req;
  req.set_job_id(job_id);
  v1::JobTrace resp;
  if (absl::Status s = Convert(stub_->GetJobTrace(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::Goodput> CoordinatorClient::GetGoodput(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetGoodputRequest req;
  req.set_job_id(job_id);
  v1::Goodput resp;
  if (absl::Status s = Convert(stub_->GetGoodput(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::JobStatus>> CoordinatorClient::ListJobs(int limit) {
  std::vector<v1::JobStatus> jobs;
  std::string token;
  do {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::ListJobsRequest req;
    const int left = limit > 0 ? limit - static_cast<int>(jobs.size()) : 0;
    req.set_page_size(limit > 0 ? std::min(left, 1000) : 1000);
    req.set_limit(req.page_size());  // what a coordinator without pages reads
    req.set_page_token(token);
    v1::ListJobsResponse resp;
    if (absl::Status s = Convert(stub_->ListJobs(&ctx, req, &resp)); !s.ok()) return s;
    for (v1::JobStatus& j : *resp.mutable_jobs()) jobs.push_back(std::move(j));
    if (resp.next_page_token() == token) break;  // no progress: never loop
    token = resp.next_page_token();
  } while (!token.empty() && (limit <= 0 || static_cast<int>(jobs.size()) < limit));
  if (limit > 0 && static_cast<int>(jobs.size()) > limit) jobs.resize(limit);
  return jobs;
}

absl::StatusOr<v1::JobStatus> CoordinatorClient::Cancel(const std::string& job_id,
                                                        const std::string& reason) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  v1::JobStatus resp;
  if (absl::Status s = Convert(stub_->CancelJob(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::JobStatus> CoordinatorClient::SetPriority(const std::string& job_id,
                                                             const std::string& priority) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::SetJobPriorityRequest req;
  req.set_job_id(job_id);
  req.set_priority(priority);
  v1::JobStatus resp;
  if (absl::Status s = Convert(stub_->SetJobPriority(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::JobStatus> CoordinatorClient::Resume(const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ResumeJobRequest req;
  req.set_job_id(job_id);
  v1::JobStatus resp;
  if (absl::Status s = Convert(stub_->ResumeJob(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<std::vector<v1::WorkerInfo>> CoordinatorClient::ListWorkers() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ListWorkersResponse resp;
  if (absl::Status s = Convert(stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp));
      !s.ok()) {
    return s;
  }
  return std::vector<v1::WorkerInfo>(resp.workers().begin(), resp.workers().end());
}

absl::StatusOr<v1::ListCheckpointsResponse> CoordinatorClient::ListCheckpoints(
    const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ListCheckpointsRequest req;
  req.set_job_id(job_id);
  v1::ListCheckpointsResponse resp;
  if (absl::Status s = Convert(stub_->ListCheckpoints(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ListJobEventsResponse> CoordinatorClient::ListJobEvents(
    const std::string& job_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ListJobEventsRequest req;
  req.set_job_id(job_id);
  v1::ListJobEventsResponse resp;
  if (absl::Status s = Convert(stub_->ListJobEvents(&ctx, req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<int64_t> CoordinatorClient::BackupDatabase(
    const std::string& path, const std::function<void(int64_t, int64_t)>& progress) {
  namespace fs = std::filesystem;
  if (fs::exists(path)) {
    return absl::AlreadyExistsError(absl::StrCat(path, " exists; not overwriting it"));
  }
  const std::string part = path + ".part";
  // The copy holds every job and token owner: readable by its owner only,
  // from its first byte (created 0600, not chmod-ed afterwards).
  if (const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600); fd >= 0) {
    ::close(fd);
  }
  std::error_code mode_ec;
  fs::permissions(part, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace,
                  mode_ec);
  std::ofstream out(part, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write ", part));
  auto discard = [&](absl::Status s) {
    out.close();
    std::error_code ec;
    fs::remove(part, ec);
    return s;
  };
  grpc::ClientContext ctx;
  // A big database takes a while: an hour at most.
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Hours(1)));
  AddToken(&ctx);
  std::unique_ptr<grpc::ClientReader<v1::DatabaseChunk>> reader =
      stub_->BackupDatabase(&ctx, v1::BackupDatabaseRequest());
  v1::DatabaseChunk chunk;
  int64_t done = 0;
  while (reader->Read(&chunk)) {
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    if (!out) return discard(absl::UnavailableError(absl::StrCat("writing ", part, " failed")));
    done += static_cast<int64_t>(chunk.data().size());
    if (progress) progress(done, chunk.total_bytes());
    if (chunk.total_bytes() > 0 && done > chunk.total_bytes()) {
      ctx.TryCancel();
      return discard(absl::DataLossError("the coordinator sent more than the copy's size"));
    }
  }
  if (absl::Status s = Convert(reader->Finish()); !s.ok()) return discard(s);
  if (chunk.total_bytes() != done) {
    return discard(absl::DataLossError(
        absl::StrCat("received ", done, " of ", chunk.total_bytes(), " bytes")));
  }
  out.close();
  if (!out) return discard(absl::UnavailableError(absl::StrCat("writing ", part, " failed")));
  std::error_code ec;
  fs::rename(part, path, ec);
  if (ec) return discard(absl::UnavailableError(absl::StrCat(path, ": ", ec.message())));
  return done;
}

absl::StatusOr<v1::JobStatus> CoordinatorClient::Watch(
    const std::string& job_id, const std::function<bool(const v1::JobEvent&)>& on_event) {
  grpc::ClientContext ctx;  // no deadline: a job may run for hours
  AddToken(&ctx);
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::CancelledError("stopped watching");
    watches_.insert(&ctx);
  }
  absl::Cleanup unregister = [this, &ctx] {
    absl::MutexLock lock(&mu_);
    watches_.erase(&ctx);
  };

  v1::WatchJobRequest req;
  req.set_job_id(job_id);
  std::shared_ptr<v1::Coordinator::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    stub = watch_stub_;
  }
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      (stub ? stub.get() : stub_.get())->WatchJob(&ctx, req);
  v1::JobEvent event;
  std::optional<v1::JobStatus> last;
  bool done = false;  // terminal state seen, or the caller stopped
  while (reader->Read(&event)) {
    last = event.status();
    const bool keep_going = on_event ? on_event(event) : true;
    if (IsTerminal(event.status().state()) || !keep_going) {
      done = true;
      break;
    }
  }
  if (done) {
    // The server may keep the stream open after the terminal event; we are
    // finished with it either way.
    ctx.TryCancel();
    reader->Finish().IgnoreError();
    return *last;
  }
  const grpc::Status status = reader->Finish();
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::CancelledError("stopped watching");
  }
  if (!status.ok()) return Convert(status);
  // The stream ended cleanly without a terminal state (e.g. the coordinator is
  // draining): ask once more, so a job that did finish is still reported.
  absl::StatusOr<v1::JobStatus> now = GetJob(job_id);
  if (now.ok() && IsTerminal(now->state())) return now;
  std::string message = absl::StrCat("the coordinator at ", address_, " ended the watch of job ",
                                     job_id, " before the job finished");
  if (!now.ok()) absl::StrAppend(&message, ": ", now.status().message());
  return absl::AbortedError(message);
}

absl::StatusOr<v1::JobStatus> CoordinatorClient::WatchReconnecting(
    const std::string& job_id, const std::function<bool(const v1::JobEvent&)>& on_event,
    const ReconnectPolicy& policy, const std::function<void(const ConnectionChange&)>& on_change) {
  Backoff backoff(policy.initial_backoff, policy.max_backoff);
  bool connected_once = false;
  std::optional<absl::Time> down_since;  // set while the coordinator is lost
  while (true) {
    bool got_event = false;
    absl::StatusOr<v1::JobStatus> result = Watch(job_id, [&](const v1::JobEvent& event) {
      if (!got_event) {
        got_event = connected_once = true;
        if (down_since.has_value()) {
          ConnectionChange change;
          change.down_for = absl::Now() - *down_since;
          down_since.reset();
          backoff.Reset();
          if (on_change) on_change(change);
        }
      }
      return on_event ? on_event(event) : true;
    });
    if (result.ok() || !connected_once || policy.give_up_after <= absl::ZeroDuration() ||
        !IsReconnectable(result.status()) || IsStopped()) {
      return result;
    }
    const absl::Time now = absl::Now();
    if (!down_since.has_value()) {
      down_since = now;
      ConnectionChange change;
      change.lost = true;
      absl::string_view reason = result.status().message();
      const std::string hint = UnreachableHint();
      absl::ConsumePrefix(&reason, hint);
      change.reason = std::string(reason);
      if (on_change) on_change(change);
    }
    const absl::Time give_up_at = *down_since + policy.give_up_after;
    if (now >= give_up_at) {
      return absl::UnavailableError(absl::StrCat(
          "lost the coordinator at ", address_, " for ", absl::FormatDuration(now - *down_since),
          "; gave up watching job ", job_id, " (it may still be running: stagewise watch ", job_id,
          "). Last error: ", result.status().message()));
    }
    if (SleepUnlessStopped(std::min(backoff.Next(), give_up_at - now))) {
      return absl::CancelledError("stopped watching");
    }
    // Each try on a fresh channel: it connects when the try begins.
    rpc::RpcOptions own = options_;
    own.own_connections = true;
    std::shared_ptr<v1::Coordinator::Stub> fresh =
        v1::Coordinator::NewStub(rpc::MakeChannel(address_, own));
    absl::MutexLock lock(&mu_);
    watch_stub_ = std::move(fresh);
  }
}

void CoordinatorClient::StopWatching() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  for (grpc::ClientContext* ctx : watches_) ctx->TryCancel();
}

bool CoordinatorClient::IsStopped() {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

bool CoordinatorClient::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopped_), d);
  return stopped_;
}

absl::Status CoordinatorClient::WaitForWorkers(int count, absl::Duration timeout,
                                               const std::function<absl::Status()>& keep_going) {
  const absl::Time end = absl::Now() + timeout;
  size_t seen = 0;
  absl::Status last_error;
  while (true) {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers();
    if (workers.ok()) {
      seen = workers->size();
      last_error = absl::OkStatus();
      if (static_cast<int>(seen) >= count) return absl::OkStatus();
    } else if (workers.status().code() != absl::StatusCode::kUnavailable) {
      return workers.status();
    } else {
      last_error = workers.status();
    }
    if (keep_going) {
      if (absl::Status s = keep_going(); !s.ok()) return s;
    }
    if (absl::Now() >= end) break;
    absl::SleepFor(std::min(absl::Milliseconds(100), end - absl::Now()));
  }
  if (!last_error.ok()) return last_error;
  return absl::DeadlineExceededError(
      absl::StrCat("only ", seen, " of ", count, " worker(s) registered with the coordinator at ",
                   address_, " within ", absl::FormatDuration(timeout)));
}

}  // namespace stagewise::client
