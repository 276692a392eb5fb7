#include "worker/collective.h"

#include <chrono>
#include <exception>
#include <stdexcept>
#include <utility>
#if STAGEWISE_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stagewise::worker {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// BucketLayout's buckets of the tensors themselves.
std::vector<std::vector<torch::Tensor>> Buckets(const std::vector<torch::Tensor>& tensors,
                                                int64_t limit) {
  std::vector<std::vector<torch::Tensor>> out;
  for (const std::vector<int>& bucket : BucketLayout(tensors, limit)) {
    std::vector<torch::Tensor>& members = out.emplace_back();
    for (int i : bucket) members.push_back(tensors[i]);
  }
  return out;
}

// What a failed gloo call becomes: DEADLINE_EXCEEDED when gloo says it timed
// out (a peer is stuck or gone silent), UNAVAILABLE otherwise (a peer closed
// its connection); `error` is gloo's text, `message` ours.
absl::Status Classified(const std::string& error, const std::string& message) {
  if (absl::StrContains(error, "imeout") || absl::StrContains(error, "imed out")) {
    return absl::DeadlineExceededError(message);
  }
  return absl::UnavailableError(message);
}

}  // namespace

struct ReplicaGroup::Gloo {
#if STAGEWISE_HAVE_GLOO
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
#endif
  c10::intrusive_ptr<c10d::Work> Allreduce(std::vector<torch::Tensor>& io) {
#if STAGEWISE_HAVE_GLOO
    return group->allreduce(io);
#else
    (void)io;
    throw std::logic_error("no gloo in this build");  // Create refuses R > 1
#endif
  }
  c10::intrusive_ptr<c10d::Work> Broadcast(std::vector<torch::Tensor>& io,
                                           const c10d::BroadcastOptions& opts) {
#if STAGEWISE_HAVE_GLOO
    return group->broadcast(io, opts);
#else
    (void)io;
    (void)opts;
    throw std::logic_error("no gloo in this build");  // Create refuses R > 1
#endif
  }
};

bool ReplicaGroup::GlooAvailable() { return STAGEWISE_HAVE_GLOO != 0; }

ReplicaGroup::ReplicaGroup(std::unique_ptr<Gloo> gloo, ReplicaGroupOptions options)
    : gloo_(std::move(gloo)), options_(std::move(options)) {}

ReplicaGroup::~ReplicaGroup() = default;

std::vector<std::vector<int>> BucketLayout(const std::vector<torch::Tensor>& tensors,
                                           int64_t limit) {
  std::vector<std::vector<int>> out;
  int64_t bytes = 0;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    const torch::Tensor& t = tensors[i];
    const torch::Tensor* first = out.empty() ? nullptr : &tensors[out.back().front()];
    const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
    const bool fits = first != nullptr && first->scalar_type() == t.scalar_type() &&
                      first->device() == t.device() && bytes + n <= limit;
    if (!fits) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().push_back(i);
    bytes += n;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ReplicaGroup>> ReplicaGroup::Create(
    c10::intrusive_ptr<c10d::Store> store, const ReplicaGroupOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat(options.name, ": replica ", options.rank, " of ",
                                                   options.size, " is not a replica"));
  }
  if (options.bucket_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.name, ": bucket_bytes must be positive"));
  }
  if (!GlooAvailable() && options.size > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.name, ": ", options.size,
        " replicas need LibTorch's ProcessGroupGloo, and this build of stagewise has none (its "
        "LibTorch came without gloo's headers; configure with -DSTAGEWISE_GLOO_INCLUDE_DIR=DIR, "
        "docs/cuda.md)"));
  }
  const absl::Time start = absl::Now();
  try {
    store->setTimeout(Millis(options.timeout));
    auto gloo = std::make_unique<Gloo>();
#if STAGEWISE_HAVE_GLOO
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(Millis(options.timeout));
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.host));
    gloo_options->threads = 2;
    gloo->group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.size,
                                                              gloo_options);
#endif
    return std::unique_ptr<ReplicaGroup>(new ReplicaGroup(std::move(gloo), options));
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string first_line = what.substr(0, what.find('\n'));
    const std::string message = absl::StrFormat(
        "%s: replica %d of %d could not meet the others on %s within %.1f s (timeout %.0f s): %s",
        options.name, options.rank, options.size, options.host,
        absl::ToDoubleSeconds(absl::Now() - start), absl::ToDoubleSeconds(options.timeout),
        first_line);
    return Classified(what, message);
  }
}

absl::Status ReplicaGroup::Failed(const std::string& what, const std::exception& e,
                                  absl::Time start) {
  const std::string error = e.what();
  broken_ = true;
  broken_reason_ = absl::StrFormat(
      "%s: %s among %d replicas failed after %.1f s (timeout %.0f s): %s", options_.name, what,
      options_.size, absl::ToDoubleSeconds(absl::Now() - start),
      absl::ToDoubleSeconds(options_.timeout), error.substr(0, error.find('\n')));
  return Classified(error, broken_reason_);
}

absl::StatusOr<ReplicaGroup::Pending> ReplicaGroup::StartSum(std::vector<torch::Tensor> members) {
  if (broken_) return absl::FailedPreconditionError(broken_reason_);
  const absl::Time start = absl::Now();
  torch::NoGradGuard no_grad;
  Pending p;
  try {
    if (members.size() == 1 && members.front().is_contiguous()) {
      p.flat = options_.keep_inputs ? members.front().clone() : members.front();
    } else {
      std::vector<torch::Tensor> views;
      views.reserve(members.size());
      for (const torch::Tensor& t : members) views.push_back(t.reshape(-1));
      p.flat = torch::cat(views);
    }
    bytes_ += p.flat.numel() * static_cast<int64_t>(p.flat.element_size());
    if (options_.size > 1) {
      std::vector<torch::Tensor> io{p.flat};
      p.work = gloo_->Allreduce(io);
    }
  } catch (const std::exception& e) {
    return Failed("all-reduce", e, start);
  }
  p.members = std::move(members);
  return p;
}

absl::Status ReplicaGroup::FinishSums(std::vector<Pending>& pending, double scale,
                                      absl::Time start) {
  if (broken_) return absl::FailedPreconditionError(broken_reason_);
  torch::NoGradGuard no_grad;
  try {
    if (options_.keep_inputs) {
      for (Pending& p : pending) {
        if (p.work) p.work->wait();
      }
    }
    for (Pending& p : pending) {
      if (p.work) p.work->wait();
      p.flat.mul_(scale);
      if (p.flat.is_same(p.members.front())) continue;
      int64_t offset = 0;
      for (torch::Tensor& t : p.members) {
        t.copy_(p.flat.narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
    }
  } catch (const std::exception& e) {
    return Failed("all-reduce", e, start);
  }
  seconds_ = seconds_.load() + absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status ReplicaGroup::SumThenScale(const std::vector<torch::Tensor>& tensors, double scale) {
  if (broken_) return absl::FailedPreconditionError(broken_reason_);
  if (options_.size == 1 || tensors.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  // Start every bucket, then wait: gloo's threads overlap them.
  std::vector<Pending> pending;
  for (auto& members : Buckets(tensors, options_.bucket_bytes)) {
    absl::StatusOr<Pending> p = StartSum(std::move(members));
    if (!p.ok()) return p.status();
    pending.push_back(*std::move(p));
  }
  return FinishSums(pending, scale, start);
}

absl::Status ReplicaGroup::AverageGradients(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const torch::Tensor& p : params) {
    if (!p.grad().defined()) {
      torch::Tensor zeros = torch::zeros_like(p);
      p.mutable_grad() = zeros;
    }
    grads.push_back(p.grad());
  }
  return SumThenScale(grads, 1.0 / options_.size);
}

absl::Status ReplicaGroup::Average(const std::vector<torch::Tensor>& tensors) {
  return SumThenScale(tensors, 1.0 / options_.size);
}

absl::Status ReplicaGroup::Broadcast(const std::vector<torch::Tensor>& tensors) {
  if (broken_) return absl::FailedPreconditionError(broken_reason_);
  if (options_.size == 1 || tensors.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  torch::NoGradGuard no_grad;
  try {
    int64_t bytes = 0;
    for (const torch::Tensor& t : tensors) {
      torch::Tensor buffer = t.is_contiguous() ? t : t.contiguous();
      std::vector<torch::Tensor> io{buffer};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      gloo_->Broadcast(io, opts)->wait();
      if (!buffer.is_same(t)) t.copy_(buffer);
      bytes += t.numel() * static_cast<int64_t>(t.element_size());
    }
    bytes_ += bytes;
  } catch (const std::exception& e) {
    return Failed("broadcast", e, start);
  }
  seconds_ = seconds_.load() + absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

}  // namespace stagewise::worker
