// Mode choice for reversible blocks under a memory budget (Jiang et al.,
// reversible training framework, Sec. 3.2-3.3; docs/references.md,
// docs/planner.md): maximise the time saved by storing instead of rebuilding, subject
// to the bytes the stored blocks keep. Memory is counted in whole units
// (weights rounded up, the capacity rounded down), so a choice that fits in
// units fits in bytes.
#ifndef STAGEWISE_SERVICES_PLANNER_KNAPSACK_H_
#define STAGEWISE_SERVICES_PLANNER_KNAPSACK_H_

#include <cstdint>
#include <vector>

namespace stagewise::planner {

struct KnapsackItem {
  double value = 0;    // t_e: time saved when the block stores (>= 0)
  int64_t weight = 0;  // m: units kept when it stores
};

struct KnapsackResult {
  double value = 0;          // the optimum
  int64_t weight = 0;        // units used by the chosen set
  std::vector<bool> chosen;  // x: true = store (compute-centric)
};

// Problem 6 by dynamic programming with backtracking (Algorithm 1, bottom-up):
// max sum value x s.t. sum weight x <= capacity, x in {0,1}^n. O(n capacity).
KnapsackResult Knapsack01(const std::vector<KnapsackItem>& items, int64_t capacity);

// The same over a chain of blocks whose neighbours share an activation: block
// i stores its graph (weight[i]) and the activation between blocks i-1 and i
// (boundary[i], i >= 1) is kept when either of them stores (boundary[0] is
// ignored). `forced[i]` blocks must store (non-reversible). With every
// boundary 0 this is Knapsack01. An infeasible instance (the forced set does
// not fit) gives value -1 and an empty choice.
struct ChainItem {
  double value = 0;
  int64_t weight = 0;
  int64_t boundary = 0;
  bool forced = false;
};
KnapsackResult ChainKnapsack(const std::vector<ChainItem>& items, int64_t capacity);

// Weight in units: ceil(bytes / unit); capacity: floor(bytes / unit).
int64_t WeightUnits(int64_t bytes, int64_t unit);
int64_t CapacityUnits(int64_t bytes, int64_t unit);

}  // namespace stagewise::planner

#endif  // STAGEWISE_SERVICES_PLANNER_KNAPSACK_H_
