// Contiguous partition of a chain of blocks over J workers minimising the
// slowest stage (exact dynamic programming over prefixes).
#ifndef STAGEWISE_SERVICES_PLANNER_PARTITION_H_
#define STAGEWISE_SERVICES_PLANNER_PARTITION_H_

#include <functional>
#include <utility>
#include <vector>

namespace stagewise::planner {

// cost(begin, end, stage): the time of blocks [begin, end) on worker `stage`,
// or +infinity where they do not fit (a memory cap). Every stage gets at least
// one block.
using RangeCost = std::function<double(int begin, int end, int stage)>;

struct PartitionResult {
  bool feasible = false;
  double bottleneck = 0;  // the slowest stage's cost
  std::vector<std::pair<int, int>> ranges;
};

// min over contiguous partitions of max_j cost(range_j, j). O(J n^2) calls
// to `cost`; each distinct (begin, end, stage) is asked once.
PartitionResult MinMaxPartition(int num_blocks, int num_stages, const RangeCost& cost);

}  // namespace stagewise::planner

#endif  // STAGEWISE_SERVICES_PLANNER_PARTITION_H_
