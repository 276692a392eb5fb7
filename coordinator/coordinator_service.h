// gRPC adapter of the JobManager (callback API; reactors never block).
#ifndef STAGEWISE_COORDINATOR_COORDINATOR_SERVICE_H_
#define STAGEWISE_COORDINATOR_COORDINATOR_SERVICE_H_

#include "coordinator/job_manager.h"
#include "stagewise/v1/coordinator.grpc.pb.h"

namespace stagewise::coordinator {

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorService(JobManager* manager) : manager_(manager) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
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
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;

 private:
  JobManager* manager_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_COORDINATOR_SERVICE_H_
