// Which device each worker `stagewise local` starts trains on (docs/cli.md,
// "local on a GPU host").
#ifndef STAGEWISE_CLIENTS_CLI_DEVICES_H_
#define STAGEWISE_CLIENTS_CLI_DEVICES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagewise::cli {

// The devices of `workers` local workers on a machine with `cuda_devices`
// CUDA devices: `flag` (--devices cpu,cuda:1,...) cycled over the workers
// when given, else the job's `device` key: cpu on the CPU, cuda:K on cuda:K,
// and cuda spreads the workers over the GPUs (worker n on cuda:(n mod N)).
// INVALID_ARGUMENT naming --devices or `device` when an entry is not cpu or
// cuda:N, or names a GPU this machine does not have.
absl::StatusOr<std::vector<std::string>> LocalWorkerDevices(const std::string& job_device,
                                                            const std::vector<std::string>& flag,
                                                            int workers, int cuda_devices);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_DEVICES_H_
