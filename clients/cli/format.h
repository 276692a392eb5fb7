// Text and JSON rendering for the CLI.
#ifndef STAGEWISE_CLIENTS_CLI_FORMAT_H_
#define STAGEWISE_CLIENTS_CLI_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "clients/cli/conventions.h"  // JsonEscape
#include "services/spec/job_spec.h"
#include "services/training/reference_trainer.h"

namespace stagewise::cli {

std::string HumanCount(int64_t n);                         // 1234567 -> "1.23M"
std::string ShapeText(const std::vector<int64_t>& shape);  // {3, 32, 32} -> "[3,32,32]"
std::string HumanDuration(double seconds);                 // 75 -> "1m15s"
// Text from the coordinator (job names, reasons, worker ids) made harmless
// for a terminal: control characters (C0, DEL, C1) become visible escapes
// (\x1b, \u009b), so a job cannot move the cursor or retitle the window.
std::string TerminalSafe(absl::string_view s);
// The same line by line: newlines kept (a multi-line error).
std::string TerminalSafeLines(absl::string_view s);
std::string ProgressLine(const training::Progress& p);
std::string ResultTable(const JobSpec& spec, const training::TrainResult& r);
std::string ResultJson(const JobSpec& spec, const training::TrainResult& r);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_FORMAT_H_
