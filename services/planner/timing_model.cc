#include "services/planner/timing_model.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stagewise::timing {

absl::StatusOr<double> InterlockSlots(int64_t A, int64_t M, int64_t N) {
  if (A < 1) return absl::InvalidArgumentError(absl::StrCat("A: must be >= 1, got ", A));
  if (M < 1) return absl::InvalidArgumentError(absl::StrCat("M: must be >= 1, got ", M));
  if (N < 1 || N > A) {
    return absl::InvalidArgumentError(absl::StrCat("N: must be in [1, A=", A, "], got ", N));
  }
  const auto a = static_cast<double>(A), m = static_cast<double>(M), n = static_cast<double>(N);
  if (M == 1) return 2 * n * m;
  if (M == 2 || A >= 2 * N - 1) return (n + 1) * m;
  return (2 + a - n) * m + 2 * (2 * n - a - 1);
}

absl::StatusOr<double> InterlockTimePerBatch(int64_t A, int64_t M, int64_t N,
                                             const MicroBatchCost& cost) {
  auto slots = InterlockSlots(A, M, N);
  if (!slots.ok()) return slots.status();
  return *slots * cost(M);
}

absl::StatusOr<int64_t> OptimalMicroBatches(int64_t A, int64_t N, const MicroBatchCost& cost,
                                            int64_t max_m) {
  if (max_m < 1) return absl::InvalidArgumentError(absl::StrCat("max_m: must be >= 1"));
  int64_t best = 0;
  double best_time = 0;
  for (int64_t m = 1; m <= max_m; m *= 2) {
    auto t = InterlockTimePerBatch(A, m, N, cost);
    if (!t.ok()) return t.status();
    if (best == 0 || *t < best_time - 1e-12 * best_time) {
      best = m;
      best_time = *t;
    }
  }
  return best;
}

absl::StatusOr<MicroBatchCost> FitMicroBatchCost(const std::vector<InterlockSample>& samples) {
  // Normal equations of min sum (u c0 + v c1 - T)^2 with u = s, v = s / M.
  double uu = 0, uv = 0, vv = 0, ut = 0, vt = 0;
  for (const InterlockSample& x : samples) {
    auto s = InterlockSlots(x.A, x.M, x.N);
    if (!s.ok()) return s.status();
    const double u = *s, v = *s / static_cast<double>(x.M);
    uu += u * u;
    uv += u * v;
    vv += v * v;
    ut += u * x.seconds;
    vt += v * x.seconds;
  }
  const double det = uu * vv - uv * uv;
  if (samples.size() < 2 || std::abs(det) <= 1e-12 * uu * vv) {
    return absl::FailedPreconditionError(
        "samples: need runs with at least two different micro-batch counts to fit c0 and c1");
  }
  return MicroBatchCost{(ut * vv - vt * uv) / det, (vt * uu - ut * uv) / det};
}

namespace {

absl::Status CheckTimes(const AuxNetTimes& t) {
  const std::pair<const char*, double> fields[] = {
      {"T_d", t.data},      {"T_f", t.forward},         {"T_b", t.backward},
      {"t_psi", t.penalty}, {"t_f_aux", t.aux_forward}, {"t_b_aux", t.aux_backward}};
  for (const auto& [name, value] : fields) {
    if (!(value >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": must be >= 0, got ", value));
    }
  }
  if (t.data + t.forward + t.backward <= 0) {
    return absl::InvalidArgumentError("T_d + T_f + T_b: must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> AuxNetSpeedup(int64_t K, const AuxNetTimes& t) {
  if (K < 1) return absl::InvalidArgumentError(absl::StrCat("K: must be >= 1, got ", K));
  if (absl::Status s = CheckTimes(t); !s.ok()) return s;
  const double serial = t.data + t.forward + t.backward;
  const double parallel = t.data + (t.forward + t.backward) / static_cast<double>(K) + t.penalty +
                          t.aux_forward + t.aux_backward;
  return serial / parallel;
}

absl::StatusOr<double> AuxNetSpeedupBound(const AuxNetTimes& t) {
  if (absl::Status s = CheckTimes(t); !s.ok()) return s;
  const double overhead = t.data + t.penalty + t.aux_forward + t.aux_backward;
  if (overhead <= 0) return std::numeric_limits<double>::infinity();
  return (t.data + t.forward + t.backward) / overhead;
}

}  // namespace stagewise::timing
