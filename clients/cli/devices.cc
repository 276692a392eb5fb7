#include "clients/cli/devices.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagewise::cli {
namespace {

// -1 for cpu, -2 for a bare cuda, K for cuda:K; nullopt otherwise.
std::optional<int> ParseDevice(const std::string& text) {
  if (text == "cpu") return -1;
  if (text == "cuda") return -2;
  int k = 0;
  if (absl::StartsWith(text, "cuda:") && absl::SimpleAtoi(text.substr(5), &k) && k >= 0) return k;
  return std::nullopt;
}

std::string NoSuchGpu(const std::string& what, const std::string& device, int cuda_devices) {
  if (cuda_devices == 0) {
    return absl::StrCat(what, ": ", device,
                        " asks for a GPU, but this machine has no CUDA device (no GPU is visible, "
                        "or this build of LibTorch has no CUDA); use cpu");
  }
  return absl::StrCat(what, ": ", device, ", but this machine has ", cuda_devices,
                      " CUDA device(s): cuda:0 to cuda:", cuda_devices - 1);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LocalWorkerDevices(const std::string& job_device,
                                                            const std::vector<std::string>& flag,
                                                            int workers, int cuda_devices) {
  std::vector<std::string> out;
  if (!flag.empty()) {
    for (const std::string& d : flag) {
      const std::optional<int> k = ParseDevice(d);
      if (!k || *k == -2) {
        return absl::InvalidArgumentError(
            absl::StrCat("--devices: '", d, "' is not cpu or cuda:N"));
      }
      if (*k >= 0 && *k >= cuda_devices) {
        return absl::InvalidArgumentError(NoSuchGpu("--devices", d, cuda_devices));
      }
    }
    for (int n = 0; n < workers; ++n) out.push_back(flag[static_cast<size_t>(n) % flag.size()]);
    return out;
  }
  const std::optional<int> k = ParseDevice(job_device);
  if (!k) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", job_device, "' is not cpu, cuda or cuda:N"));
  }
  if (*k != -1 && (cuda_devices == 0 || *k >= cuda_devices)) {
    return absl::InvalidArgumentError(
        absl::StrCat(NoSuchGpu("device", job_device, cuda_devices),
                     " (or choose each worker's device with --devices)"));
  }
  for (int n = 0; n < workers; ++n) {
    out.push_back(*k == -1   ? "cpu"
                  : *k == -2 ? absl::StrCat("cuda:", n % cuda_devices)
                             : job_device);
  }
  return out;
}

}  // namespace stagewise::cli
