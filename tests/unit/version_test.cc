// services/common/version.h: which versions work together.
#include "services/common/version.h"

#include <gtest/gtest.h>

namespace stagewise {
namespace {

TEST(Version, ThisBuildHasOneOnALine) { EXPECT_FALSE(VersionLine(Version()).empty()) << Version(); }

TEST(Version, ALineIsTheMajorOrBeforeOneTheMinor) {
  EXPECT_EQ(VersionLine("0.1.0"), "0.1");
  EXPECT_EQ(VersionLine("0.1.7"), "0.1");
  EXPECT_EQ(VersionLine("0.12"), "0.12");
  EXPECT_EQ(VersionLine("2.4.0"), "2");
  EXPECT_EQ(VersionLine("2.4.0-rc1"), "2");
  EXPECT_EQ(VersionLine("2"), "");
  EXPECT_EQ(VersionLine("latest"), "");
  EXPECT_EQ(VersionLine("-1.2.3"), "");
  EXPECT_EQ(VersionLine("1.x.0"), "");
}

TEST(Version, PeersOnAnotherLineAreRefusedNamingBothVersions) {
  EXPECT_TRUE(CheckPeerVersion("0.1.0", "0.1.4", "the worker w1").ok());
  EXPECT_TRUE(CheckPeerVersion("2.0.0", "2.9.1", "the worker w1").ok());
  EXPECT_TRUE(CheckPeerVersion("0.1.0", "", "this client").ok());  // does not say
  const absl::Status minor = CheckPeerVersion("0.1.0", "0.2.0", "the worker w1");
  EXPECT_EQ(minor.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(minor.message(),
            "the worker w1 runs stagewise 0.2.0 and this coordinator 0.1.0: versions 0.2 and 0.1 "
            "do not work together; run one version line across the cluster (deploy/README.md, "
            "\"Upgrading\")");
  EXPECT_EQ(CheckPeerVersion("1.0.0", "2.0.0", "this client").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckPeerVersion("1.0.0", "one", "this client").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagewise
