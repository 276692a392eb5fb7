// The c10d Store the replicas of a stage meet through (docs/replicas.md):
// each operation is one Coordinator.CollectiveStore call on the worker's own
// authenticated channel, so rendezvous needs no port of its own and no
// replica hosts a server; keys are scoped to the job's attempt (the
// coordinator drops them when it ends) and prefixed with the stage here.
// Reads of a missing key poll (the coordinator never blocks a call).
#ifndef STAGEWISE_WORKER_COORDINATOR_STORE_H_
#define STAGEWISE_WORKER_COORDINATOR_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "stagewise/v1/coordinator.grpc.pb.h"

namespace stagewise::worker {

class CoordinatorStore : public c10d::Store {
 public:
  struct Scope {
    std::string worker_id;
    std::string session;
    std::string job_id;
    int attempt = 0;
    std::string prefix;  // e.g. "stage1/"
  };
  // `stub` must outlive the store.
  CoordinatorStore(v1::Coordinator::StubInterface* stub, Scope scope,
                   std::chrono::milliseconds timeout);

  // c10d::Store. No `override`: the methods LibTorch's Store declares differ
  // between versions (1.x has no clone), and each matching one overrides.
  // Errors are exceptions (c10d's contract), which ReplicaGroup turns into
  // statuses.
  void set(const std::string& key, const std::vector<uint8_t>& value);
  std::vector<uint8_t> get(const std::string& key);
  int64_t add(const std::string& key, int64_t value);
  bool deleteKey(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  int64_t getNumKeys();
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout);
  c10::intrusive_ptr<c10d::Store> clone();

 private:
  v1::CollectiveStoreResponse Call(v1::CollectiveStoreRequest request);

  v1::Coordinator::StubInterface* stub_;
  Scope scope_;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_COORDINATOR_STORE_H_
