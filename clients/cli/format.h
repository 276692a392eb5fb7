// Text and JSON rendering for the CLI.
#ifndef STAGEWISE_CLIENTS_CLI_FORMAT_H_
#define STAGEWISE_CLIENTS_CLI_FORMAT_H_

#include <cstdint>
#include <string>

#include "services/common/job_spec.h"
#include "services/training/reference_trainer.h"

namespace stagewise::cli {

std::string HumanCount(int64_t n);          // 1234567 -> "1.23M"
std::string HumanDuration(double seconds);  // 75 -> "1m15s"
std::string JsonEscape(const std::string& s);
std::string ProgressLine(const training::Progress& p);
std::string ResultTable(const JobSpec& spec, const training::TrainResult& r);
std::string ResultJson(const JobSpec& spec, const training::TrainResult& r);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_FORMAT_H_
