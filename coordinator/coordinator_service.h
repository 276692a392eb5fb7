// gRPC adapter of the JobManager (callback API; reactors never block).
#ifndef STAGEWISE_COORDINATOR_COORDINATOR_SERVICE_H_
#define STAGEWISE_COORDINATOR_COORDINATOR_SERVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/job_manager.h"
#include "services/rpc/tokens.h"
#include "stagewise/v1/coordinator.grpc.pb.h"

namespace stagewise::coordinator {

// Who may call what (docs/security.md).
struct AccessPolicy {
  // Bearer tokens of clients (null: no token is asked for, every client is
  // an admin; the coordinator logs a WARNING at startup).
  const rpc::TokenTable* tokens = nullptr;
  // A tokens file kept current (--tokens with reloading): when set, it is
  // used instead of `tokens`.
  const rpc::TokenFile* token_file = nullptr;
  // With TLS on, RegisterWorker and Control accept only peers whose
  // certificate identity is a worker's: "worker", or "worker-*" / "worker.*".
  // Off (plaintext) there is no certificate to check.
  bool require_worker_identity = false;
};

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorService(JobManager* manager, AccessPolicy policy = {})
      : manager_(manager), policy_(policy) {}

  // ListJobs pages: page_size (or limit) 0 means kDefaultJobsPage; larger
  // ones are cut to kMaxJobsPage, and a page ends early before its statuses
  // pass kMaxJobsPageBytes (far below the message limit, whatever is stored).
  static constexpr int kDefaultJobsPage = 100;
  static constexpr int kMaxJobsPage = 1000;
  static constexpr size_t kMaxJobsPageBytes = 4 << 20;

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  // Workers only (same rule as RegisterWorker), for a job they run a stage of.
  grpc::ServerUnaryReactor* CollectiveStore(grpc::CallbackServerContext* ctx,
                                            const v1::CollectiveStoreRequest* request,
                                            v1::CollectiveStoreResponse* response) override;
  grpc::ServerBidiReactor<v1::WorkerEvent, v1::Command>* Control(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* request,
                                   v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* request,
                                      v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* ctx,
                                      const v1::ResumeJobRequest* request,
                                      v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* SetJobPriority(grpc::CallbackServerContext* ctx,
                                           const v1::SetJobPriorityRequest* request,
                                           v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerWriteReactor<v1::DatabaseChunk>* BackupDatabase(
      grpc::CallbackServerContext* ctx, const v1::BackupDatabaseRequest* request) override;
  grpc::ServerUnaryReactor* ListJobEvents(grpc::CallbackServerContext* ctx,
                                          const v1::ListJobEventsRequest* request,
                                          v1::ListJobEventsResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* GetJobMetrics(grpc::CallbackServerContext* ctx,
                                          const v1::GetJobMetricsRequest* request,
                                          v1::JobMetrics* response) override;
  grpc::ServerUnaryReactor* GetJobTrace(grpc::CallbackServerContext* ctx,
                                        const v1::GetJobTraceRequest* request,
                                        v1::JobTrace* response) override;
  grpc::ServerUnaryReactor* GetGoodput(grpc::CallbackServerContext* ctx,
                                       const v1::GetGoodputRequest* request,
                                       v1::Goodput* response) override;

 private:
  // The caller of a client RPC if it may do `needed`: UNAUTHENTICATED without
  // a known token, PERMISSION_DENIED when its role is too low.
  absl::StatusOr<rpc::Principal> Authorize(grpc::CallbackServerContext* ctx,
                                           rpc::Role needed) const;
  // A submit token may `verb` (cancel, resume) only jobs it submitted; an
  // admin token any: PERMISSION_DENIED naming both owners otherwise.
  absl::StatusOr<rpc::Principal> AuthorizeOwner(grpc::CallbackServerContext* ctx,
                                                const std::string& job_id, const char* verb);
  // OK if the caller may act as a worker.
  absl::Status AuthorizeWorker(grpc::CallbackServerContext* ctx) const;

  JobManager* manager_;
  AccessPolicy policy_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_COORDINATOR_SERVICE_H_
