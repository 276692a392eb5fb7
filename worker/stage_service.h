// The worker's StageService (gRPC): Exchange streams from stage j-1's worker,
// bound to a stage by their first message, and CopyReplica. Every Exchange
// stream takes a slot of --max-streams until it is destroyed; before its
// first message it is also pending in the gate (stream_gate.h): at most
// --max-pending-streams of those, each for at most
// --stream-first-message-timeout. A reaper thread closes the expired ones.
// What a stream carries is the stage's business (the route hook).
#ifndef STAGEWISE_WORKER_STAGE_SERVICE_H_
#define STAGEWISE_WORKER_STAGE_SERVICE_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "stagewise/v1/stage.grpc.pb.h"
#include "worker/peer_stream.h"

namespace stagewise::worker {

struct StageServiceOptions {
  int max_streams = 64;          // --max-streams
  int max_pending_streams = 16;  // --max-pending-streams
  // TLS is on: Exchange and CopyReplica take only worker certificates
  // (rpc::IsWorkerIdentity).
  bool require_worker_identity = false;
  absl::Duration first_message_timeout = absl::Seconds(10);  // --stream-first-message-timeout
  // Binds a new Exchange stream to a stage by its first message and the
  // peer's certificate identity (Worker::Route); PERMISSION_DENIED when no
  // stage here takes it.
  std::function<absl::Status(const v1::StageMessage& first, const std::string& peer_identity,
                             std::shared_ptr<UpstreamStream> stream, MessageSink** sink)>
      route;
  // A piece of the state a surviving replica published (Worker::CopyReplica).
  std::function<absl::Status(const v1::CopyReplicaRequest&, v1::CopyReplicaResponse*)> copy_replica;
};

class WorkerStageService : public v1::StageService::CallbackService {
 public:
  // Counts refusals in stagewise_worker_streams_refused_total{reason}.
  WorkerStageService(StageServiceOptions options, prometheus::Registry& registry);
  ~WorkerStageService() override;

  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext* ctx) override;
  // recovery.replay with replicas: a replacing replica copies this one's
  // state. Only workers ask; the stage checks the copy's token.
  grpc::ServerUnaryReactor* CopyReplica(grpc::CallbackServerContext* ctx,
                                        const v1::CopyReplicaRequest* request,
                                        v1::CopyReplicaResponse* response) override;

 private:
  // The streams that have not sent their first message, shared with every
  // stream's slot (a bound stream may outlive the service).
  struct Pending;
  void CloseStream(std::weak_ptr<PeerStream> weak, const char* reason);
  // Closes the pending streams whose first-message deadline passed; sleeps
  // until the next deadline or a new stream.
  void Reap();

  const StageServiceOptions options_;
  std::shared_ptr<std::atomic<int>> open_;
  const std::shared_ptr<Pending> pending_;
  prometheus::Family<prometheus::Counter>& refused_;
  std::thread reaper_;  // last: it starts once everything above is built
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_SERVICE_H_
