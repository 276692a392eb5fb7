#include "services/planner/knapsack.h"

#include <algorithm>
#include <limits>

namespace stagewise::planner {

int64_t WeightUnits(int64_t bytes, int64_t unit) {
  return bytes <= 0 ? 0 : (bytes + unit - 1) / unit;
}
int64_t CapacityUnits(int64_t bytes, int64_t unit) { return bytes <= 0 ? 0 : bytes / unit; }

KnapsackResult Knapsack01(const std::vector<KnapsackItem>& items, int64_t capacity) {
  const size_t n = items.size();
  const int64_t C = std::max<int64_t>(capacity, 0);
  // saved[i][j]: the most time saved with the first i items and j units.
  std::vector<std::vector<double>> saved(n + 1, std::vector<double>(C + 1, 0.0));
  for (size_t i = 1; i <= n; ++i) {
    const KnapsackItem& it = items[i - 1];
    for (int64_t j = 0; j <= C; ++j) {
      saved[i][j] = saved[i - 1][j];
      if (it.weight <= j)
        saved[i][j] = std::max(saved[i][j], saved[i - 1][j - it.weight] + it.value);
    }
  }
  KnapsackResult r;
  r.value = saved[n][C];
  r.chosen.assign(n, false);
  for (size_t i = n, j = C; i >= 1; --i) {
    if (saved[i][j] != saved[i - 1][j]) {
      r.chosen[i - 1] = true;
      j -= items[i - 1].weight;
      r.weight += items[i - 1].weight;
    }
  }
  return r;
}

KnapsackResult ChainKnapsack(const std::vector<ChainItem>& items, int64_t capacity) {
  const size_t n = items.size();
  const int64_t C = std::max<int64_t>(capacity, 0);
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  KnapsackResult r;
  if (n == 0) return r;
  // best[i][x][c]: most value over blocks 0..i with block i's choice x and
  // exactly c units used; from[i][x][c]: block i-1's choice on that path.
  std::vector<std::vector<std::vector<double>>> best(
      n, std::vector<std::vector<double>>(2, std::vector<double>(C + 1, kNone)));
  std::vector<std::vector<std::vector<char>>> from(
      n, std::vector<std::vector<char>>(2, std::vector<char>(C + 1, 0)));
  for (int x = 0; x < 2; ++x) {
    if (items[0].forced && x == 0) continue;
    const int64_t w = x ? items[0].weight : 0;
    if (w <= C) best[0][x][w] = x ? items[0].value : 0.0;
  }
  for (size_t i = 1; i < n; ++i) {
    for (int x = 0; x < 2; ++x) {
      if (items[i].forced && x == 0) continue;
      for (int p = 0; p < 2; ++p) {
        const int64_t add = (x ? items[i].weight : 0) + ((x || p) ? items[i].boundary : 0);
        for (int64_t c = 0; c + add <= C; ++c) {
          if (best[i - 1][p][c] == kNone) continue;
          const double v = best[i - 1][p][c] + (x ? items[i].value : 0.0);
          if (v > best[i][x][c + add]) {
            best[i][x][c + add] = v;
            from[i][x][c + add] = static_cast<char>(p);
          }
        }
      }
    }
  }
  double top = kNone;
  int bx = 0;
  int64_t bc = 0;
  for (int x = 0; x < 2; ++x) {
    for (int64_t c = 0; c <= C; ++c) {
      // Ties: the fewer units.
      if (best[n - 1][x][c] > top) {
        top = best[n - 1][x][c];
        bx = x;
        bc = c;
      }
    }
  }
  if (top == kNone) {
    r.value = -1;
    return r;
  }
  r.value = top;
  r.weight = bc;
  r.chosen.assign(n, false);
  for (size_t i = n; i-- > 0;) {
    r.chosen[i] = bx == 1;
    if (i == 0) break;
    const int p = from[i][bx][bc];
    bc -= (bx ? items[i].weight : 0) + ((bx || p) ? items[i].boundary : 0);
    bx = p;
  }
  return r;
}

}  // namespace stagewise::planner
