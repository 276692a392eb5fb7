// Analytic time-per-mini-batch models of the papers, for the planner and for
// comparing measured step times with predictions. No LibTorch, no I/O.
#ifndef STAGEWISE_SERVICES_PLANNER_TIMING_MODEL_H_
#define STAGEWISE_SERVICES_PLANNER_TIMING_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace stagewise::timing {

// Interlocking Backpropagation (Gomez, Key et al., Sec. 3.1 and App. C;
// docs/references.md): the cost of
// one time slot for a mini-batch split into M micro-batches,
// c(M) = c0 + c1 / M (a per-micro-batch overhead plus work proportional to
// its size).
struct MicroBatchCost {
  double c0 = 0;  // seconds per micro-batch, whatever its size
  double c1 = 0;  // seconds per whole mini-batch of work
  double operator()(int64_t m) const { return c0 + c1 / static_cast<double>(m); }
};

// T(A, M, N) / c(M): the period of the timing diagram in slots, for A
// accelerators (stages), M micro-batches and N-WISE parameter N in [1, A]
// (N = 1 local learning, N = A end-to-end; M >= 2 with N = A is GPipe):
//   M = 1:                2N * M
//   M = 2:                (N + 1) * M
//   M > 2, A >= 2N - 1:   (N + 1) * M
//   M > 2, A <  2N - 1:   (2 + A - N) * M + 2(2N - A - 1)
// INVALID_ARGUMENT names the bad argument.
absl::StatusOr<double> InterlockSlots(int64_t A, int64_t M, int64_t N);

// T(A, M, N) = InterlockSlots(A, M, N) * c(M), seconds per mini-batch.
absl::StatusOr<double> InterlockTimePerBatch(int64_t A, int64_t M, int64_t N,
                                             const MicroBatchCost& cost);

// The M in {1, 2, 4, ..., max_m} (powers of two) with the smallest T(A, M, N);
// the smaller M on ties (Interlocking Backpropagation, Table 7).
absl::StatusOr<int64_t> OptimalMicroBatches(int64_t A, int64_t N, const MicroBatchCost& cost,
                                            int64_t max_m = 64);

// One measured time per mini-batch of a run with A stages, M micro-batches
// and parameter N.
struct InterlockSample {
  int64_t A = 1, M = 1, N = 1;
  double seconds = 0;
};

// Least-squares fit of (c0, c1) to measured times: T = s * c0 + (s / M) * c1
// with s = InterlockSlots(A, M, N), linear in (c0, c1). Needs samples with at
// least two distinct s/M ratios; FAILED_PRECONDITION otherwise.
absl::StatusOr<MicroBatchCost> FitMicroBatchCost(const std::vector<InterlockSample>& samples);

// Layer-parallel training with auxiliary-variable networks (AuxNet paper,
// Sun et al., Sec. 4.2.1; docs/references.md): per iteration, layer-serial
// training costs T_d + T_f + T_b (data, forward, backward); K-way layer-parallel training costs
// T_d + (T_f + T_b)/K + t_psi + t_f_aux + t_b_aux (local penalty losses, AuxNet
// forward and distillation). Eq. (27):
//   rho = (T_d + T_f + T_b) / (T_d + (T_f + T_b)/K + t_psi + t_f_aux + t_b_aux)
// bounded above (K -> infinity) by
//   (T_d + T_f + T_b) / (T_d + t_psi + t_f_aux + t_b_aux).
struct AuxNetTimes {
  double data = 0;          // T_d
  double forward = 0;       // T_f, the whole network, layer-serial
  double backward = 0;      // T_b
  double penalty = 0;       // t_psi
  double aux_forward = 0;   // t_f^(lambda)
  double aux_backward = 0;  // t_b^(lambda)
};

// rho(K); INVALID_ARGUMENT for K < 1 or a negative time.
absl::StatusOr<double> AuxNetSpeedup(int64_t K, const AuxNetTimes& t);
// The K -> infinity limit; infinite when the overheads are all zero.
absl::StatusOr<double> AuxNetSpeedupBound(const AuxNetTimes& t);

}  // namespace stagewise::timing

#endif  // STAGEWISE_SERVICES_PLANNER_TIMING_MODEL_H_
