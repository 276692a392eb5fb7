#include "services/planner/partition.h"

#include <algorithm>
#include <limits>

namespace stagewise::planner {

PartitionResult MinMaxPartition(int num_blocks, int num_stages, const RangeCost& cost) {
  PartitionResult r;
  const int n = num_blocks, J = num_stages;
  if (J < 1 || n < J) return r;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[j][i]: the smallest bottleneck of stages 0..j covering blocks [0, i);
  // cut[j][i]: where stage j begins on that optimum.
  std::vector<std::vector<double>> best(J, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(J, std::vector<int>(n + 1, -1));
  for (int i = 1; i <= n - (J - 1); ++i) best[0][i] = cost(0, i, 0), cut[0][i] = 0;
  for (int j = 1; j < J; ++j) {
    for (int i = j + 1; i <= n - (J - 1 - j); ++i) {
      for (int k = j; k < i; ++k) {
        if (best[j - 1][k] == kInf) continue;
        const double c = cost(k, i, j);
        const double v = std::max(best[j - 1][k], c);
        if (v < best[j][i]) {
          best[j][i] = v;
          cut[j][i] = k;
        }
      }
    }
  }
  if (best[J - 1][n] == kInf) return r;
  r.feasible = true;
  r.bottleneck = best[J - 1][n];
  r.ranges.resize(J);
  for (int j = J - 1, i = n; j >= 0; --j) {
    const int k = cut[j][i];
    r.ranges[j] = {k, i};
    i = k;
  }
  return r;
}

}  // namespace stagewise::planner
