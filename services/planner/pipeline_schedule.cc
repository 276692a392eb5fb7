#include "services/planner/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace stagewise::pipeline {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::infinity();

absl::Status CheckOptions(const ScheduleOptions& o) {
  if (o.stages < 1)
    return absl::InvalidArgumentError(absl::StrCat("stages: must be >= 1, got ", o.stages));
  if (o.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batches: must be >= 1, got ", o.micro_batches));
  }
  if (o.lookahead < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lookahead: must be >= 0, got ", o.lookahead));
  }
  if (!o.costs.empty() && static_cast<int>(o.costs.size()) != o.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("costs: one per stage (", o.stages, "), got ", o.costs.size()));
  }
  for (size_t j = 0; j < o.costs.size(); ++j) {
    const StageCosts& c = o.costs[j];
    if (!(c.forward >= 0) || !(c.backward_input >= 0) || !(c.backward_weight >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("costs[", j, "]: negative or NaN"));
    }
  }
  if (!(o.link_seconds >= 0)) return absl::InvalidArgumentError("link_seconds: negative or NaN");
  if (o.chunks < 1)
    return absl::InvalidArgumentError(absl::StrCat("chunks: must be >= 1, got ", o.chunks));
  return absl::OkStatus();
}

StageCosts CostsOf(const ScheduleOptions& o, int j) {
  return o.costs.empty() ? StageCosts{} : o.costs[static_cast<size_t>(j)];
}

double OpSeconds(const StageCosts& c, OpKind kind) {
  switch (kind) {
    case OpKind::kForward:
      return c.forward;
    case OpKind::kBackward:
      return c.backward_input + c.backward_weight;
    case OpKind::kBackwardInput:
      return c.backward_input;
    case OpKind::kBackwardWeight:
      return c.backward_weight;
  }
  return 0;
}

std::vector<Op> GpipeOrder(int J, int j, int M) {
  std::vector<Op> ops;
  const bool last = j == J - 1;
  for (int i = 0; i < M; ++i) {
    ops.push_back({OpKind::kForward, i});
    if (last) ops.push_back({OpKind::kBackward, i});
  }
  if (!last) {
    for (int i = 0; i < M; ++i) ops.push_back({OpKind::kBackward, i});
  }
  return ops;
}

std::vector<Op> OneFOneBOrder(int J, int j, int M, int lookahead) {
  if (j == J - 1) return GpipeOrder(J, j, M);
  const int warm = std::min(J - 1 - j + lookahead, M);
  std::vector<Op> ops;
  for (int i = 0; i < warm; ++i) ops.push_back({OpKind::kForward, i});
  for (int i = warm; i < M; ++i) {
    ops.push_back({OpKind::kForward, i});
    ops.push_back({OpKind::kBackward, i - warm});
  }
  for (int i = M - warm; i < M; ++i) ops.push_back({OpKind::kBackward, i});
  return ops;
}

// ZB-H1 (the paper's handcrafted schedule): 1F1B's warm-up and order of
// forwards and backwards, with each backward split into B and W and stage
// j's W running j micro-batches behind its B (stage 0: fused backwards). The
// deferred W fill the time a stage would wait for the next forward; every
// stage holds at most J (+ lookahead) micro-batches, 1F1B's peak. With equal
// F, B and W costs one mini-batch takes 3M + (J-1) units against 1F1B's
// 3M + 3(J-1): the (J-1)(F+B-W) bubble of the paper.
std::vector<Op> ZbH1Order(int J, int j, int M, int lookahead) {
  if (j == 0 || J == 1) return OneFOneBOrder(J, j, M, lookahead);
  const int warm = j == J - 1 ? 0 : std::min(J - 1 - j + lookahead, M);
  std::vector<Op> ops;
  int next_w = 0, done_b = 0;
  const auto backward = [&](int i) {
    ops.push_back({OpKind::kBackwardInput, i});
    if (++done_b > j) ops.push_back({OpKind::kBackwardWeight, next_w++});
  };
  for (int i = 0; i < warm; ++i) ops.push_back({OpKind::kForward, i});
  for (int i = warm; i < M; ++i) {
    ops.push_back({OpKind::kForward, i});
    backward(i - warm);
  }
  for (int i = M - warm; i < M; ++i) backward(i);
  while (next_w < M) ops.push_back({OpKind::kBackwardWeight, next_w++});
  return ops;
}

std::vector<Op> InterleavedOrder(int J, int j, int M, int v) {
  const int total = M * v;
  const auto forward = [&](int k) {
    return Op{OpKind::kForward, (k / (J * v)) * J + k % J, (k / J) % v};
  };
  const auto backward = [&](int k) {
    return Op{OpKind::kBackward, (k / (J * v)) * J + k % J, v - 1 - (k / J) % v};
  };
  const int warm = std::min(2 * (J - 1 - j) + (v - 1) * J, total);
  std::vector<Op> ops;
  int f = 0, b = 0;
  while (f < warm) ops.push_back(forward(f++));
  while (f < total) {
    ops.push_back(forward(f++));
    ops.push_back(backward(b++));
  }
  while (b < total) ops.push_back(backward(b++));
  return ops;
}

}  // namespace

int MaxInFlight(PipelineSchedule schedule, const ScheduleOptions& o, int stage) {
  const int J = o.stages, M = o.micro_batches;
  const bool last = stage == J - 1;
  int cap = 1;
  switch (schedule) {
    case PipelineSchedule::kGpipe:
      cap = last ? 1 : M;
      break;
    case PipelineSchedule::kOneFOneB:
      cap = last ? 1 : J - stage + o.lookahead;
      break;
    case PipelineSchedule::kZbH1:
      cap = J == 1 ? 1 : last ? J : J + o.lookahead;
      break;
    case PipelineSchedule::kInterleaved:
      return std::max(1, std::min(2 * (J - 1 - stage) + (o.chunks - 1) * J + 1, M * o.chunks));
  }
  return std::max(1, std::min(cap, M));
}

absl::StatusOr<std::vector<std::vector<Op>>> StageOrders(PipelineSchedule schedule,
                                                         const ScheduleOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const int J = options.stages, M = options.micro_batches;
  if (schedule != PipelineSchedule::kInterleaved && options.chunks != 1) {
    return absl::InvalidArgumentError("chunks: more than one chunk per worker needs interleaved");
  }
  if (schedule == PipelineSchedule::kInterleaved && M % J != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batches: interleaved needs a multiple of the stage count ", J, ", got ", M));
  }
  std::vector<std::vector<Op>> orders;
  for (int j = 0; j < J; ++j) {
    switch (schedule) {
      case PipelineSchedule::kGpipe:
        orders.push_back(GpipeOrder(J, j, M));
        break;
      case PipelineSchedule::kOneFOneB:
        orders.push_back(OneFOneBOrder(J, j, M, options.lookahead));
        break;
      case PipelineSchedule::kZbH1:
        orders.push_back(ZbH1Order(J, j, M, options.lookahead));
        break;
      case PipelineSchedule::kInterleaved:
        orders.push_back(InterleavedOrder(J, j, M, options.chunks));
        break;
    }
  }
  return orders;
}

absl::StatusOr<Simulation> Simulate(const std::vector<std::vector<Op>>& orders,
                                    const ScheduleOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  const int J = o.stages, M = o.micro_batches, v = o.chunks, S = J * v;
  if (static_cast<int>(orders.size()) != J) {
    return absl::FailedPreconditionError(
        absl::StrCat("orders: one per stage (", J, "), got ", orders.size()));
  }
  // End times of each virtual stage's forward, backward-or-B and W per
  // micro-batch; virtual stage s = chunk * J + worker.
  std::vector<std::vector<double>> f_end(S, std::vector<double>(M, kUnknown)), b_end = f_end,
                                                                               w_end = f_end;
  std::vector<size_t> next(J, 0);
  std::vector<double> free(J, 0);
  std::vector<int> held(J, 0);
  Simulation sim;
  sim.busy_seconds.assign(J, 0);
  sim.peak_in_flight.assign(J, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < J; ++j) {
      while (next[j] < orders[j].size()) {
        const Op& op = orders[j][next[j]];
        const int i = op.micro_batch;
        if (i < 0 || i >= M || op.chunk < 0 || op.chunk >= v) {
          return absl::FailedPreconditionError(
              absl::StrCat("stage ", j, ": ", OpName(op), " outside M = ", M, " or chunks = ", v));
        }
        const int st = op.chunk * J + j;
        double ready = 0;
        switch (op.kind) {
          case OpKind::kForward:
            ready = st == 0 ? 0 : f_end[st - 1][i] + o.link_seconds;
            break;
          case OpKind::kBackward:
          case OpKind::kBackwardInput:
            ready = st == S - 1 ? f_end[st][i] : b_end[st + 1][i] + o.link_seconds;
            if (f_end[st][i] == kUnknown) ready = kUnknown;
            break;
          case OpKind::kBackwardWeight:
            ready = b_end[st][i];
            break;
        }
        if (ready == kUnknown) break;
        const double already = op.kind == OpKind::kForward          ? f_end[st][i]
                               : op.kind == OpKind::kBackwardWeight ? w_end[st][i]
                                                                    : b_end[st][i];
        if (already != kUnknown) {
          return absl::FailedPreconditionError(
              absl::StrCat("stage ", j, ": ", OpName(op), " appears twice"));
        }
        const double start = std::max(ready, free[j]);
        const double secs = OpSeconds(CostsOf(o, j), op.kind) / v;
        free[j] = start + secs;
        sim.busy_seconds[j] += secs;
        if (op.kind == OpKind::kForward) {
          f_end[st][i] = free[j];
          sim.peak_in_flight[j] = std::max(sim.peak_in_flight[j], ++held[j]);
        } else if (op.kind == OpKind::kBackwardWeight) {
          w_end[st][i] = free[j];
          --held[j];
        } else {
          b_end[st][i] = free[j];
          if (op.kind == OpKind::kBackward) --held[j];
        }
        ++next[j];
        progress = true;
      }
    }
  }
  for (int j = 0; j < J; ++j) {
    if (next[j] < orders[j].size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", j, " deadlocks at ", OpName(orders[j][next[j]]), " (operation ", next[j], ")"));
    }
    sim.seconds = std::max(sim.seconds, free[j]);
  }
  for (int st = 0; st < S; ++st) {
    for (int i = 0; i < M; ++i) {
      if (f_end[st][i] == kUnknown || b_end[st][i] == kUnknown) {
        return absl::FailedPreconditionError(absl::StrCat("stage ", st % J, " chunk ", st / J,
                                                          ": micro-batch ", i,
                                                          " has no forward or no backward"));
      }
    }
  }
  double busy = 0;
  for (double b : sim.busy_seconds) busy += b;
  sim.bubble = sim.seconds > 0 ? 1 - busy / J / sim.seconds : 0;
  return sim;
}

std::string OpName(const Op& op) {
  const std::string chunk = op.chunk > 0 ? absl::StrCat("c", op.chunk) : "";
  switch (op.kind) {
    case OpKind::kForward:
      return absl::StrCat("F", op.micro_batch, chunk);
    case OpKind::kBackward:
      return absl::StrCat("B", op.micro_batch, chunk);
    case OpKind::kBackwardInput:
      return absl::StrCat("Bi", op.micro_batch, chunk);
    case OpKind::kBackwardWeight:
      return absl::StrCat("W", op.micro_batch, chunk);
  }
  return "?";
}

}  // namespace stagewise::pipeline
