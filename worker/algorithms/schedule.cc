#include "worker/algorithms/schedule.h"

#include "services/common/status_macros.h"
#include "worker/algorithms/common.h"

namespace stagewise::worker {

absl::Status RunLockStep(StageContext& ctx, const StepFn& step) {
  for (int64_t t = 0; t < ctx.total_steps(); ++t) {
    STAGEWISE_RETURN_IF_ERROR(ctx.Interrupted());
    STAGEWISE_RETURN_IF_ERROR(step(t));
    if (ctx.EvalDue(t + 1)) STAGEWISE_RETURN_IF_ERROR(RunEvaluation(ctx, t + 1));
  }
  return absl::OkStatus();
}

absl::Status RunDrainedPipeline(StageContext& ctx, int64_t depth, const StepFn& forward,
                                const StepFn& backward) {
  const int64_t total = ctx.total_steps();
  for (int64_t begin = 0; begin < total;) {
    int64_t end = begin + 1;
    while (end < total && !ctx.EvalDue(end)) ++end;
    for (int64_t f = begin, b = begin; b < end;) {
      STAGEWISE_RETURN_IF_ERROR(ctx.Interrupted());
      if (f < end && f - b < depth) {
        STAGEWISE_RETURN_IF_ERROR(forward(f++));
        if (ctx.last()) ++b;
      } else {
        STAGEWISE_RETURN_IF_ERROR(backward(b++));
      }
    }
    if (ctx.EvalDue(end)) STAGEWISE_RETURN_IF_ERROR(RunEvaluation(ctx, end));
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace stagewise::worker
