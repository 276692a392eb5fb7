// JobLabels: the job label of the metric series, as the coordinator's
// --metrics-job-ids asks (plain, a keyed hash, or none).
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "services/metrics/metrics.h"

namespace stagewise::metrics {

std::string JobLabels::Of(const std::string& job_id) const {
  switch (mode) {
    case Mode::kPlain:
      return job_id;
    case Mode::kOmitted:
      return "";
    case Mode::kHashed:
      break;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(job_id.data()), job_id.size(), digest, &size);
  const std::string hex = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), std::min(size, 8u)));
  return absl::StrCat("h", hex);
}

absl::StatusOr<JobLabels> MakeJobLabels(const std::string& mode, const std::string& key_file) {
  JobLabels labels;
  if (mode == "plain" || mode.empty()) {
    labels.mode = JobLabels::Mode::kPlain;
  } else if (mode == "omitted") {
    labels.mode = JobLabels::Mode::kOmitted;
  } else if (mode == "hashed") {
    labels.mode = JobLabels::Mode::kHashed;
    if (key_file.empty()) {
      return absl::InvalidArgumentError(
          "--metrics-job-key-file: required with --metrics-job-ids hashed (job ids are 32 random "
          "bits: an unkeyed hash would be reversed by trying them all)");
    }
    std::ifstream in(key_file, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics-job-key-file: cannot read ", key_file));
    }
    labels.key = bytes.str();
    while (!labels.key.empty() && (labels.key.back() == '\n' || labels.key.back() == '\r')) {
      labels.key.pop_back();
    }
    if (labels.key.size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics-job-key-file: ", key_file, " holds ", labels.key.size(),
          " bytes; a key needs at least 16 (e.g. head -c 32 /dev/urandom | base64 > FILE)"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-job-ids: must be one of plain, hashed, omitted; got '",
                     mode.substr(0, 64), "'"));
  }
  return labels;
}

}  // namespace stagewise::metrics
