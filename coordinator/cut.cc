#include "coordinator/cut.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stagewise::coordinator {

Cut Cut::Recut(std::vector<std::pair<int, int>> new_ranges) const {
  Cut out;
  out.schedule = schedule;
  if (!modes.empty()) {
    int blocks = 0;
    for (const auto& [b, e] : ranges) blocks = std::max(blocks, e);
    for (const auto& [b, e] : new_ranges) blocks = std::max(blocks, e);
    std::vector<BlockMode> by_block(static_cast<size_t>(blocks), BlockMode::kStore);
    for (size_t j = 0; j < ranges.size() && j < modes.size(); ++j) {
      for (int b = ranges[j].first; b < ranges[j].second; ++b) {
        const size_t i = static_cast<size_t>(b - ranges[j].first);
        if (i < modes[j].size()) by_block[static_cast<size_t>(b)] = modes[j][i];
      }
    }
    for (const auto& [b, e] : new_ranges) {
      out.modes.emplace_back(by_block.begin() + b, by_block.begin() + e);
    }
  }
  out.ranges = std::move(new_ranges);
  return out;
}

std::string Cut::Text() const {
  std::string out;
  for (const auto& [b, e] : ranges)
    absl::StrAppend(&out, out.empty() ? "" : " ", "[", b, ",", e, ")");
  return out;
}

}  // namespace stagewise::coordinator
