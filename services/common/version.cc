#include "services/common/version.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace stagewise {

const char* Version() { return STAGEWISE_VERSION; }

std::string VersionLine(absl::string_view version) {
  const std::vector<absl::string_view> parts = absl::StrSplit(version, '.');
  if (parts.size() < 2) return "";
  int numbers[2];
  for (int i = 0; i < 2; ++i) {
    if (parts[i].empty() || !absl::ascii_isdigit(static_cast<unsigned char>(parts[i][0])) ||
        !absl::SimpleAtoi(parts[i], &numbers[i]) || numbers[i] < 0) {
      return "";
    }
  }
  return numbers[0] == 0 ? absl::StrCat("0.", numbers[1]) : absl::StrCat(numbers[0]);
}

absl::Status CheckPeerVersion(absl::string_view mine, absl::string_view peer,
                              absl::string_view who) {
  if (peer.empty()) return absl::OkStatus();
  const std::string line = VersionLine(peer);
  if (line.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(who, " sent version '", peer.substr(0, 32),
                                                   "', which is not MAJOR.MINOR.PATCH"));
  }
  if (line == VersionLine(mine)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      who, " runs stagewise ", peer, " and this coordinator ", mine, ": versions ", line, " and ",
      VersionLine(mine),
      " do not work together; run one version line across the cluster (deploy/README.md, "
      "\"Upgrading\")"));
}

absl::Status CheckPeerVersion(absl::string_view peer, absl::string_view who) {
  return CheckPeerVersion(Version(), peer, who);
}

}  // namespace stagewise
