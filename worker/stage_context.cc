#include "worker/stage_context.h"

#include "services/common/status_macros.h"
#include "services/data/sizes.h"
#include "services/planner/plan_proto.h"
#include "services/training/optimizer.h"
#include "worker/stage_assignment.h"
#include "worker/stage_replicas.h"

namespace stagewise::worker {

double StageContext::LearningRate(int64_t step) const {
  const PhaseWindow w = window();
  return training::LearningRateAt(spec().schedule, w.base_lr, step, w.steps_per_epoch,
                                  w.total_steps);
}

bool StageContext::EvalDue(int64_t steps_done) const {
  const PhaseWindow w = window();
  return data::EvalDue(spec().eval, w.offset, w.total_steps, steps_done, w.steps_per_epoch);
}

EncodeOptions StageContext::Wire(bool to_next) const { return WireOptions(spec(), to_next); }

absl::Status StageContext::SendTensorsTo(Side side, v1::StageMessage message,
                                         std::vector<OutgoingTensor> tensors) {
  STAGEWISE_RETURN_IF_ERROR(EncodeInto(&message, tensors));
  return SendTo(side, std::move(message));
}

data::Batch StageContext::TrainBatch(int64_t step) const {
  const PhaseWindow w = window();
  const int64_t global = w.offset + step;
  data::Batch b = train_batches().Get(global / w.steps_per_epoch, global % w.steps_per_epoch);
  if (num_replicas() > 1) {
    // Replica r's share: rows [r B/R, (r+1) B/R) of the mini-batch all
    // replicas draw alike (batch_size is a multiple of R, job_spec.cc).
    const int64_t share = b.x.size(0) / num_replicas();
    b.x = b.x.narrow(0, replica() * share, share);
    b.y = b.y.narrow(0, replica() * share, share);
  }
  return b;
}

absl::Status StageContext::AverageReplicaGradients(torch::optim::Optimizer* extra) {
  StageReplicas* r = replicas();
  return r == nullptr ? absl::OkStatus() : r->AverageGradients(optimizer(), extra);
}

absl::Status StageContext::AverageReplicaGradientsOf(torch::optim::Optimizer& optimizer) {
  StageReplicas* r = replicas();
  return r == nullptr ? absl::OkStatus() : r->AverageGradientsOf(optimizer);
}

void StageContext::ArmReplicaOverlap() {
  if (StageReplicas* r = replicas(); r != nullptr) r->ArmOverlap(optimizer());
}

absl::Status StageContext::SyncReplicas(torch::optim::Optimizer* extra) {
  StageReplicas* r = replicas();
  return r == nullptr ? absl::OkStatus() : r->Sync(optimizer(), extra);
}

}  // namespace stagewise::worker
