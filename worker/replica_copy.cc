#include "worker/replica_copy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"
#include "services/common/log.h"
#include "services/common/status_macros.h"
#include "services/rpc/status.h"
#include "stagewise/v1/stage.grpc.pb.h"

namespace stagewise::worker {

void ReplicaCopy::NoteStepStart(int64_t phase_step, const checkpoint::ShardPosition::Marks& marks,
                                const torch::nn::Module& model) {
  torch::Tensor rng;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  // Buffers (BatchNorm's running statistics) change in the step's forwards,
  // which the copy computes again: it takes them as they were now.
  std::vector<torch::Tensor> buffers;
  {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& b : model.buffers()) buffers.push_back(b.clone());
  }
  absl::MutexLock lock(&mu_);
  phase_step_ = phase_step;
  marks_ = marks;
  rng_ = std::move(rng);
  buffers_ = std::move(buffers);
}

absl::Status ReplicaCopy::Publish(int generation, std::string token, checkpoint::ShardPosition at,
                                  int64_t phase_offset, torch::nn::Module& model,
                                  torch::optim::Optimizer& optimizer) {
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::ShardExtras extras;
  std::vector<torch::Tensor> start_buffers;
  {
    absl::MutexLock lock(&mu_);
    if (phase_step_ < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("stage ", at.stage, ": no step began, nothing to publish for a copy"));
    }
    at.phase_step = phase_step_;
    at.step = phase_offset + phase_step_;
    at.marks = marks_;
    extras.rng = true;
    extras.rng_state = rng_;
    start_buffers = buffers_;
  }
  // The parameters and optimizer state are the step's start's until the
  // step's optimizer step, which waits for the average this replica is in;
  // the buffers are put back as the step began for the copy, then restored.
  std::vector<torch::Tensor> buffers = model.buffers(), now;
  if (start_buffers.size() != buffers.size()) {
    return absl::InternalError(absl::StrCat("stage ", at.stage, ": ", buffers.size(),
                                            " buffers now, ", start_buffers.size(),
                                            " when the step began"));
  }
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) {
      now.push_back(buffers[i].clone());
      buffers[i].copy_(start_buffers[i]);
    }
  }
  absl::StatusOr<std::string> serialized = checkpoint::SerializeShard(at, model, optimizer, extras);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(now[i]);
  }
  STAGEWISE_ASSIGN_OR_RETURN(std::string bytes, std::move(serialized));
  const uint32_t crc = checkpoint::Crc32(bytes);
  const size_t size = bytes.size();
  {
    absl::MutexLock lock(&mu_);
    generation_ = generation;
    token_ = std::move(token);
    bytes_ = std::make_shared<const std::string>(std::move(bytes));
    crc32_ = crc;
  }
  STAGEWISE_LOG(INFO)
      << "stage " << at.stage << " published its state at step " << at.step << " (" << size
      << " bytes in "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
      << " s) for a lost replica's copy";
  return absl::OkStatus();
}

void ReplicaCopy::Release() {
  absl::MutexLock lock(&mu_);
  bytes_.reset();
}

int64_t ReplicaCopy::copied_bytes() const {
  absl::MutexLock lock(&mu_);
  return copied_bytes_;
}

double ReplicaCopy::copy_seconds() const {
  absl::MutexLock lock(&mu_);
  return copy_seconds_;
}

absl::Status ReplicaCopy::Serve(const v1::CopyReplicaRequest& request,
                                v1::CopyReplicaResponse* response) const {
  std::shared_ptr<const std::string> bytes;
  uint32_t crc = 0;
  {
    absl::MutexLock lock(&mu_);
    if (bytes_ == nullptr || generation_ != request.generation()) {
      return absl::UnavailableError(absl::StrCat("CopyReplica: stage ", request.stage(),
                                                 " has not published its state for generation ",
                                                 request.generation(), " yet"));
    }
    if (request.token() != token_) {
      return absl::PermissionDeniedError("CopyReplica: token: not this copy's");
    }
    bytes = bytes_;
    crc = crc32_;
  }
  const int64_t total = static_cast<int64_t>(bytes->size());
  if (request.offset() < 0 || request.offset() > total) {
    return absl::OutOfRangeError(
        absl::StrCat("CopyReplica: offset ", request.offset(), " of a state of ", total, " bytes"));
  }
  const int64_t n = std::min(kReplicaCopyChunk, total - request.offset());
  response->set_data(bytes->substr(static_cast<size_t>(request.offset()), static_cast<size_t>(n)));
  response->set_total_bytes(total);
  response->set_crc32(crc);
  return absl::OkStatus();
}

namespace {

// The bytes of the state `assignment.replica_source` names (ReplicaCopy::Fetch).
absl::StatusOr<std::string> CopyBytes(const v1::StageAssignment& assignment,
                                      const rpc::RpcOptions& rpc, absl::Duration timeout,
                                      const std::function<bool()>& stopped) {
  const v1::ReplicaSource& source = assignment.replica_source();
  const std::string who = absl::StrCat("copying stage ", assignment.stage(), " from replica ",
                                       source.replica(), " (", source.address(), ")");
  std::shared_ptr<grpc::Channel> channel = rpc::MakeChannel(source.address(), rpc);
  std::unique_ptr<v1::StageService::Stub> stub = v1::StageService::NewStub(channel);
  v1::CopyReplicaRequest request;
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_stage(assignment.stage());
  request.set_generation(source.generation());
  request.set_token(source.token());
  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  int64_t total = -1;
  uint32_t crc = 0;
  absl::Status last;
  while (total < 0 || static_cast<int64_t>(out.size()) < total) {
    if (stopped && stopped()) return absl::CancelledError(absl::StrCat(who, ": the stage stopped"));
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(who, ": not done within ", absl::FormatDuration(timeout), " (", out.size(),
                       " of ", total, " bytes; last: ", last.message(), ")"));
    }
    request.set_offset(static_cast<int64_t>(out.size()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::CopyReplicaResponse response;
    last = rpc::FromGrpcStatus(stub->CopyReplica(&ctx, request, &response));
    if (last.code() == absl::StatusCode::kUnavailable ||
        last.code() == absl::StatusCode::kDeadlineExceeded) {
      // Not published yet (the survivor still computes its step), or the
      // channel is still connecting.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (!last.ok()) return absl::Status(last.code(), absl::StrCat(who, ": ", last.message()));
    if (total >= 0 && (response.total_bytes() != total || response.crc32() != crc)) {
      return absl::AbortedError(absl::StrCat(who,
                                             ": the survivor published another state "
                                             "while it was being copied"));
    }
    total = response.total_bytes();
    crc = response.crc32();
    if (response.data().empty() && static_cast<int64_t>(out.size()) < total) {
      return absl::DataLossError(absl::StrCat(who, ": an empty piece at byte ", out.size()));
    }
    if (total > 0 && out.empty()) out.reserve(static_cast<size_t>(total));
    out += response.data();
  }
  if (checkpoint::Crc32(out) != crc) {
    return absl::DataLossError(absl::StrCat(who, ": CRC-32 mismatch over ", total, " bytes"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<checkpoint::ShardReader>> ReplicaCopy::Fetch(
    const v1::StageAssignment& assignment, const rpc::RpcOptions& rpc, absl::Duration timeout,
    const std::function<bool()>& stopped, const torch::Device& device) {
  const v1::ReplicaSource& source = assignment.replica_source();
  const std::string what = absl::StrCat("the copy of stage ", assignment.stage(), " from replica ",
                                        source.replica(), " (", source.address(), ")");
  const auto t0 = std::chrono::steady_clock::now();
  STAGEWISE_ASSIGN_OR_RETURN(const std::string bytes, CopyBytes(assignment, rpc, timeout, stopped));
  STAGEWISE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardReader> shard,
                             checkpoint::ShardReader::Parse(bytes, device, what));
  const checkpoint::ShardPosition& at = shard->position();
  if (at.stage != assignment.stage() || at.block_begin != assignment.block_begin() ||
      at.block_end != assignment.block_end() || !at.marks.known()) {
    return absl::DataLossError(absl::StrCat(
        what, ": holds stage ", at.stage, ", blocks [", at.block_begin, ", ", at.block_end,
        "), this stage's are [", assignment.block_begin(), ", ", assignment.block_end(), ")"));
  }
  absl::MutexLock lock(&mu_);
  copied_bytes_ = static_cast<int64_t>(bytes.size());
  copy_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return shard;
}

}  // namespace stagewise::worker
