#include "coordinator/collective_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagewise::coordinator {

absl::Status CollectiveStores::Apply(const v1::CollectiveStoreRequest& request,
                                     v1::CollectiveStoreResponse* response) {
  using Op = v1::CollectiveStoreRequest;
  if (request.key().size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CollectiveStoreRequest.key: ", request.key().size(), " bytes, at most ", kMaxKeyBytes));
  }
  if (request.value().size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("CollectiveStoreRequest.value: ", request.value().size(), " bytes, at most ",
                     kMaxValueBytes));
  }
  absl::MutexLock lock(&mu_);
  Attempt& a = by_job_[request.job_id()];
  if (request.attempt() > a.attempt) {
    a = Attempt{request.attempt(), {}};
  } else if (request.attempt() < a.attempt) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", request.attempt(), " of job ", request.job_id(), " is over"));
  }
  auto& values = a.values;
  const bool adds_key = (request.op() == Op::SET || request.op() == Op::ADD) &&
                        values.find(request.key()) == values.end();
  if (adds_key && values.size() >= kMaxKeysPerAttempt) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", request.job_id(), " holds ", values.size(),
                     " collective store keys, the most one attempt may"));
  }
  switch (request.op()) {
    case Op::SET:
      values[request.key()] = request.value();
      return absl::OkStatus();
    case Op::GET: {
      auto it = values.find(request.key());
      response->set_found(it != values.end());
      if (it != values.end()) response->set_value(it->second);
      return absl::OkStatus();
    }
    case Op::ADD: {
      int64_t now = 0;
      auto it = values.find(request.key());
      if (it != values.end() && !absl::SimpleAtoi(it->second, &now)) {
        return absl::InvalidArgumentError(
            absl::StrCat("CollectiveStoreRequest.key: '", request.key(), "' is not a counter"));
      }
      now += request.amount();
      values[request.key()] = absl::StrCat(now);
      response->set_number(now);
      return absl::OkStatus();
    }
    case Op::CHECK: {
      bool all = true;
      for (const std::string& k : request.keys()) all = all && values.count(k) > 0;
      response->set_found(all);
      return absl::OkStatus();
    }
    case Op::DELETE:
      response->set_found(values.erase(request.key()) > 0);
      return absl::OkStatus();
    case Op::COUNT:
      response->set_number(static_cast<int64_t>(values.size()));
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("CollectiveStoreRequest.op: unknown op ", request.op()));
  }
}

void CollectiveStores::Drop(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  by_job_.erase(job_id);
}

size_t CollectiveStores::jobs() const {
  absl::MutexLock lock(&mu_);
  return by_job_.size();
}

}  // namespace stagewise::coordinator
