// What the benchmark programs share: the median they report (tests/bench).
#ifndef STAGEWISE_TESTS_BENCH_BENCH_UTIL_H_
#define STAGEWISE_TESTS_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <vector>

namespace stagewise::bench {

// The median of `v` (the mean of the two middle values for an even count);
// 0 for an empty list.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace stagewise::bench

#endif  // STAGEWISE_TESTS_BENCH_BENCH_UTIL_H_
