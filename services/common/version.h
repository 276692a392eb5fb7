// stagewise's own version, and which versions work together: the
// coordinator refuses a worker or a CLI of another line with a message that
// names both versions (deploy/README.md, "Upgrading").
//
// A line is the major version; before 1.0 it is major.minor (0.1.x and 0.2.y
// are different lines, 0.1.0 and 0.1.3 the same one). Within a line the wire
// protocol and the database schema only grow compatibly.
#ifndef STAGEWISE_SERVICES_COMMON_VERSION_H_
#define STAGEWISE_SERVICES_COMMON_VERSION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stagewise {

// This build's version ("0.1.0").
const char* Version();

// The gRPC metadata key a CLI (CoordinatorClient) sends its version under.
inline constexpr char kVersionMetadataKey[] = "x-stagewise-version";

// "0.1" for 0.1.3, "2" for 2.4.0; "" when `version` is not MAJOR.MINOR[.PATCH...].
std::string VersionLine(absl::string_view version);

// OK when `peer` (a worker's or a CLI's version; `who` says which, e.g. "the
// worker w3") is on this build's line, or unknown (empty: an older client
// that does not say). FAILED_PRECONDITION otherwise, naming both versions;
// INVALID_ARGUMENT for a version that is not one.
absl::Status CheckPeerVersion(absl::string_view peer, absl::string_view who);
// The same against another `mine` (tests).
absl::Status CheckPeerVersion(absl::string_view mine, absl::string_view peer,
                              absl::string_view who);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_VERSION_H_
