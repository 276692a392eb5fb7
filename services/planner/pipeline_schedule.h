// The exact pipeline schedules as per-stage orders of operations for one
// mini-batch (GPipe, 1F1B, and the zero-bubble schedule ZB-H1 of Qi et al.,
// "Zero Bubble Pipeline Parallelism", 2023), and an event
// simulator that predicts a schedule's time per mini-batch, bubble and peak
// memory from per-stage operation costs. No LibTorch, no I/O: the worker runs
// its stage's order (worker/algorithms/backprop.cc), the planner and the
// benchmarks predict with the same code (docs/algorithms.md, backprop).
#ifndef STAGEWISE_SERVICES_PLANNER_PIPELINE_SCHEDULE_H_
#define STAGEWISE_SERVICES_PLANNER_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/spec/enums.h"

namespace stagewise::pipeline {

// What a stage does with one micro-batch.
//   kForward:        the forward (the last stage: with the loss);
//   kBackward:       the whole backward at once (input and weight gradients);
//   kBackwardInput:  the input gradient only (B, sent on to stage j-1 at once);
//   kBackwardWeight: the weight gradients of a micro-batch whose B is done (W).
enum class OpKind { kForward, kBackward, kBackwardInput, kBackwardWeight };

struct Op {
  OpKind kind = OpKind::kForward;
  int micro_batch = 0;
  int chunk = 0;  // kInterleaved: which of the worker's chunks (else 0)
  bool operator==(const Op& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// The schedules: PipelineSchedule (services/spec/enums.h).

// Seconds per micro-batch of one stage's operations. A fused backward
// (kBackward) costs backward_input + backward_weight.
struct StageCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
};

struct ScheduleOptions {
  int stages = 1;         // J >= 1
  int micro_batches = 1;  // M >= 1
  int lookahead = 0;      // 1F1B and ZB-H1: extra forwards in flight per stage
  int chunks = 1;         // kInterleaved: v >= 1 chunks per worker (1 elsewhere)
  // Per stage (size J), or empty for unit costs (Simulate only). With
  // chunks, a worker's costs are for all its chunks; one chunk's op costs 1/v.
  std::vector<StageCosts> costs;
  double link_seconds = 0;  // per message between neighbouring stages
};

// How many micro-batches stage j holds at most (forward done, weight
// gradients not yet): M for GPipe, J - j + lookahead for 1F1B, J + lookahead
// on every stage for ZB-H1 (1F1B's peak, stage 0's; J on the last stage);
// 1 on the last stage of GPipe and 1F1B; never more than M. Interleaved:
// chunk-micro-batches (each 1/v of a stage's activations), min(2(J-1-j) +
// (v-1)J + 1, vM).
int MaxInFlight(PipelineSchedule schedule, const ScheduleOptions& options, int stage);

// The order of every stage's operations for one mini-batch, orders[j] for
// stage j; each micro-batch appears once as kForward and once as kBackward,
// or as kBackwardInput then kBackwardWeight. Forwards, backwards (or B) and W
// each run in micro-batch order on a stage, so messages arrive in the order
// they are consumed. ZB-H1 is the paper's handcrafted schedule: 1F1B's order
// of forwards and backwards, each backward split into B and W, stage j's W
// running j micro-batches behind its B, the rest after the last B. Stage 0
// has no input gradient to send, so it runs fused backwards (1F1B). The
// optimizer step follows the last W of each stage: a step per stage, no
// all-stage synchronisation, the pipeline flushed between mini-batches. The
// orders do not depend on the costs. Interleaved is Megatron's order: the
// k-th forward of every worker is chunk (k / J) mod v of micro-batch
// (k / Jv) J + k mod J, backwards likewise from the last chunk; worker j warms
// up with 2(J-1-j) + (v-1)J forwards, then alternates; M must be a multiple
// of J. INVALID_ARGUMENT names a bad option.
absl::StatusOr<std::vector<std::vector<Op>>> StageOrders(PipelineSchedule schedule,
                                                         const ScheduleOptions& options);

// One mini-batch of `orders` played out with options.costs and link_seconds:
// every stage starts an operation when the previous one in its order is done
// and its input is there (a forward: stage j-1's forward + a link; a
// backward or B: stage j+1's backward or B + a link, or the stage's own
// forward on the last stage; a W: its own B). With chunks, "stage" is the
// virtual stage c*J + j of op.chunk c on worker j.
struct Simulation {
  double seconds = 0;                // time per mini-batch (the last stage's end)
  std::vector<double> busy_seconds;  // per stage: time spent computing
  std::vector<int> peak_in_flight;   // per stage: micro-batches held at once
  double bubble = 0;                 // 1 - mean(busy) / seconds
};

// FAILED_PRECONDITION when the orders deadlock or miss an operation.
absl::StatusOr<Simulation> Simulate(const std::vector<std::vector<Op>>& orders,
                                    const ScheduleOptions& options);

// "F3", "B3", "Bi3", "W3" (chunk 0), "F3c1" (chunk 1): one operation, for logs and tests.
std::string OpName(const Op& op);

}  // namespace stagewise::pipeline

#endif  // STAGEWISE_SERVICES_PLANNER_PIPELINE_SCHEDULE_H_
