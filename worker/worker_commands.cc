// The worker's stage commands (Worker::RunStageCommand), on its stage-task
// thread: one at a time, in the order the coordinator sent them.
#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "services/common/log.h"
#include "worker/coordinator_store.h"
#include "worker/worker.h"

namespace stagewise::worker {

void Worker::RunStageCommand(const v1::Command& command) {
  switch (command.command_case()) {
    case v1::Command::kConfigure: {
      const v1::StageAssignment& a = command.configure();
      std::shared_ptr<StageRuntime> old = runtime();
      // Interleaved: the next virtual stage of the attempt this worker holds
      // joins the ones configured before it.
      const bool same_attempt =
          old && old->job_id() == a.job_id() && old->attempt() == a.attempt() && !old->started();
      bool busy = false;
      for (const auto& rt : runtimes()) busy = busy || rt->running();
      if (busy && !same_attempt) {
        if (old->job_id() != a.job_id()) {
          EmitError(a.job_id(), a.stage(),
                    absl::FailedPreconditionError(absl::StrCat("busy with job ", old->job_id())),
                    a.attempt());
          return;
        }
        // A new attempt of the job this worker still runs (the coordinator
        // recovered it): the old attempt is over.
        StopAll(absl::AbortedError(absl::StrCat("superseded by attempt ", a.attempt())), false);
      }
      if (options_.before_stage_build) options_.before_stage_build(a);
      RuntimeEnv env;
      env.device = device_;
      env.registry = &metrics_->registry();
      env.job_labels = options_.job_labels;
      env.emit = [this](v1::WorkerEvent e) { Emit(std::move(e)); };
      env.rpc = options_.rpc;
      env.data_roots = options_.data_roots;
      env.checkpoint_roots = options_.checkpoint_roots;
      env.model_roots = options_.model_roots;
      env.clock = clock_;
      env.collective_timeout = options_.collective_timeout;
      env.emulated_speed = options_.emulated_speed;
      env.shared_memory_dir = options_.shared_memory_dir;
      env.shared_ring_bytes = static_cast<uint64_t>(options_.shared_memory_mib) << 20;
      env.emulated_speed_source = &emulated_speed_;
      env.collective_store = [this](const v1::StageAssignment& assignment) {
        CoordinatorStore::Scope scope;
        {
          absl::MutexLock lock(&mu_);
          scope.worker_id = worker_id_;
          scope.session = session_;
        }
        scope.job_id = assignment.job_id();
        scope.attempt = assignment.attempt();
        scope.prefix = absl::StrCat("stage", assignment.stage(), "/");
        return c10::make_intrusive<CoordinatorStore>(
            coordinator_.get(), std::move(scope),
            std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.collective_timeout)));
      };
      {
        absl::MutexLock lock(&mu_);
        if (!same_attempt) turns_ = std::make_shared<DeviceTurns>();
        env.turns = turns_;
      }
      auto rt = StageRuntime::Create(a, std::move(env));
      if (!rt.ok()) {
        EmitError(a.job_id(), a.stage(), rt.status(), a.attempt(), a.replica());
        return;
      }
      {
        absl::MutexLock lock(&mu_);
        if (!same_attempt) runtimes_.clear();
        // A repeated assignment of a stage replaces its runtime.
        runtimes_.erase(std::remove_if(runtimes_.begin(), runtimes_.end(),
                                       [&](const auto& r) { return r->stage() == a.stage(); }),
                        runtimes_.end());
        runtimes_.push_back(*rt);
        std::sort(runtimes_.begin(), runtimes_.end(),
                  [](const auto& x, const auto& y) { return x->stage() < y->stage(); });
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kStart: {
      const std::vector<std::shared_ptr<StageRuntime>> all = runtimes();
      if (all.empty() || all.front()->job_id() != command.start().job_id()) {
        EmitError(
            command.start().job_id(), -1,
            absl::FailedPreconditionError("start for a job this worker is not configured for"));
        return;
      }
      // Every stage this worker holds; a multi-phase job goes on with its
      // next phase on the same runtimes.
      for (const auto& rt : all) {
        absl::Status s = rt->started() ? rt->BeginPhase(command.start().phase()) : rt->Start();
        // A replacing stage (recovery.replay) replays phases the job has
        // finished already: they need no go-ahead.
        if (s.ok()) rt->ReleaseThrough(command.start().phase());
        if (!s.ok()) {
          EmitError(rt->job_id(), rt->stage(), s);
          return;
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kCheckpointSoon: {
      // Stage 0 of the attempt picks the step (StageRuntime::RequestCheckpoint);
      // anything else is stale and only acknowledged.
      const v1::CheckpointCommand& c = command.checkpoint_soon();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() == c.job_id() && rt->attempt() == c.attempt() && rt->stage() == 0 &&
            rt->running()) {
          STAGEWISE_LOG(INFO) << "job " << c.job_id() << ": checkpoint requested (" << c.reason()
                              << ")";
          rt->RequestCheckpoint();
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kNeighbourReplaced: {
      // recovery.replay: a neighbour of a stage here moved to another worker.
      const v1::NeighbourReplaced& r = command.neighbour_replaced();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() != r.job_id() || rt->attempt() != r.attempt() ||
            std::abs(rt->stage() - r.stage()) != 1) {
          continue;
        }
        STAGEWISE_LOG(INFO) << "job " << r.job_id() << ": stage " << r.stage() << " moved to "
                            << r.address() << "; reconnecting stage " << rt->stage();
        if (absl::Status s = rt->NeighbourReplaced(r); !s.ok()) {
          rt->Fail(absl::UnavailableError(s.message()));
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kCheckpointCommitted: {
      const v1::CheckpointCommitted& c = command.checkpoint_committed();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() == c.job_id() && rt->attempt() == c.attempt()) {
          rt->CheckpointCommitted(c.step());
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kReplicaRegroup: {
      // recovery.replay with replicas: a replica of a stage here was lost.
      const v1::ReplicaRegroup& r = command.replica_regroup();
      for (const auto& rt : runtimes()) {
        if (rt->job_id() == r.job_id() && rt->attempt() == r.attempt() &&
            rt->stage() == r.stage()) {
          STAGEWISE_LOG(INFO) << "job " << r.job_id() << ": stage " << r.stage()
                              << " regroups its replicas as generation " << r.generation();
          rt->ReplicaRegroup(r);
        }
      }
      Ack(command.command_id());
      return;
    }
    case v1::Command::kStop: {
      std::shared_ptr<StageRuntime> rt = runtime();
      if (rt && rt->job_id() == command.stop().job_id()) {
        StopAll(absl::CancelledError(command.stop().reason()), false);
      }
      Ack(command.command_id());
      return;
    }
    default:
      return;
  }
}

}  // namespace stagewise::worker
