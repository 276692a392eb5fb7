#include "worker/coordinator_store.h"

#include <grpcpp/grpcpp.h>

#include <stdexcept>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stagewise::worker {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(20);
constexpr auto kCallDeadline = std::chrono::seconds(10);

}  // namespace

CoordinatorStore::CoordinatorStore(v1::Coordinator::StubInterface* stub, Scope scope,
                                   std::chrono::milliseconds timeout)
    : c10d::Store(timeout), stub_(stub), scope_(std::move(scope)) {}

v1::CollectiveStoreResponse CoordinatorStore::Call(v1::CollectiveStoreRequest request) {
  request.set_worker_id(scope_.worker_id);
  request.set_session(scope_.session);
  request.set_job_id(scope_.job_id);
  request.set_attempt(scope_.attempt);
  v1::CollectiveStoreResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  const grpc::Status s = stub_->CollectiveStore(&ctx, request, &response);
  if (!s.ok()) {
    throw std::runtime_error(absl::StrCat("Coordinator.CollectiveStore: ", s.error_message(),
                                          " (code ", static_cast<int>(s.error_code()), ")"));
  }
  return response;
}

void CoordinatorStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  v1::CollectiveStoreRequest r;
  r.set_op(v1::CollectiveStoreRequest::SET);
  r.set_key(scope_.prefix + key);
  r.set_value(std::string(value.begin(), value.end()));
  Call(std::move(r));
}

std::vector<uint8_t> CoordinatorStore::get(const std::string& key) {
  wait({key});
  v1::CollectiveStoreRequest r;
  r.set_op(v1::CollectiveStoreRequest::GET);
  r.set_key(scope_.prefix + key);
  const v1::CollectiveStoreResponse resp = Call(std::move(r));
  if (!resp.found()) throw std::runtime_error(absl::StrCat("key '", key, "' vanished"));
  return std::vector<uint8_t>(resp.value().begin(), resp.value().end());
}

int64_t CoordinatorStore::add(const std::string& key, int64_t value) {
  v1::CollectiveStoreRequest r;
  r.set_op(v1::CollectiveStoreRequest::ADD);
  r.set_key(scope_.prefix + key);
  r.set_amount(value);
  return Call(std::move(r)).number();
}

bool CoordinatorStore::deleteKey(const std::string& key) {
  v1::CollectiveStoreRequest r;
  r.set_op(v1::CollectiveStoreRequest::DELETE);
  r.set_key(scope_.prefix + key);
  return Call(std::move(r)).found();
}

bool CoordinatorStore::check(const std::vector<std::string>& keys) {
  v1::CollectiveStoreRequest r;
  r.set_op(v1::CollectiveStoreRequest::CHECK);
  for (const std::string& k : keys) r.add_keys(scope_.prefix + k);
  return Call(std::move(r)).found();
}

int64_t CoordinatorStore::getNumKeys() {
  v1::CollectiveStoreRequest r;
  r.set_op(v1::CollectiveStoreRequest::COUNT);
  return Call(std::move(r)).number();
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!check(keys)) {
    if (timeout != kNoTimeout && std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error(absl::StrCat("Wait timeout after ", timeout.count(),
                                            " ms for keys of ", scope_.prefix, " (",
                                            keys.empty() ? "" : keys.front(), "...)"));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

c10::intrusive_ptr<c10d::Store> CoordinatorStore::clone() {
  return c10::make_intrusive<CoordinatorStore>(stub_, scope_, timeout_);
}

}  // namespace stagewise::worker
