// `stagewise trace`: a job's pipeline timeline (docs/trace.md).
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/cli/commands.h"
#include "clients/cli/conventions.h"
#include "clients/cli/doctor.h"
#include "clients/cli/job_watch.h"
#include "clients/cli/timeline.h"
#include "clients/client/coordinator_client.h"
#include "services/checkpoint/checkpoint.h"

namespace stagewise::cli {
namespace {

// A trace file `trace -o` or `local --trace` wrote, or a job on the coordinator.
absl::StatusOr<v1::JobTrace> LoadTrace(const std::string& source, const std::string& coordinator) {
  if (IsFileSource(source)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(source, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": no such file"));
    }
    std::ifstream in(source, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return absl::InvalidArgumentError(absl::StrCat(source, ": cannot read it"));
    return ParseChromeTrace(text.str(), source);
  }
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(coordinator));
  absl::StatusOr<v1::JobTrace> trace = client.GetJobTrace(source);
  if (!trace.ok() && trace.status().code() == absl::StatusCode::kNotFound) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": neither a trace file nor a job on the coordinator"));
  }
  return trace;
}

// The exit code (and message) for a trace that did not load: 2 for a
// SOURCE that is neither a trace file nor a job, else as ReportError.
int TraceLoadError(const absl::Status& s, std::ostream& err) {
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    err << "error: " << s.message() << "\n";
    return kExitInvalid;
  }
  return ReportError(s, err);
}

}  // namespace

absl::Status WriteTraceFiles(const v1::JobTrace& trace, const std::string& json,
                             const std::string& svg) {
  if (!svg.empty() && !absl::EndsWith(svg, ".svg")) {
    return absl::InvalidArgumentError(absl::StrCat("--svg ", svg, ": the file must end in .svg"));
  }
  if (!json.empty()) {
    if (absl::Status s = checkpoint::WriteFileAtomically(json, ChromeTraceJson(trace)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(json, ": ", s.message()));
    }
  }
  if (!svg.empty()) {
    if (absl::Status s = checkpoint::WriteFileAtomically(svg, TimelineSvg(trace)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(svg, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

int Trace(const TraceArgs& args, std::ostream& out, std::ostream& err) {
  if (!args.svg.empty() && !absl::EndsWith(args.svg, ".svg")) {
    err << "error: --svg " << args.svg << ": the file must end in .svg\n";
    return kExitInvalid;
  }
  absl::StatusOr<v1::JobTrace> trace = LoadTrace(args.source, args.coordinator);
  if (!trace.ok()) return TraceLoadError(trace.status(), err);
  if (absl::Status s = WriteTraceFiles(*trace, args.output, args.svg); !s.ok()) {
    err << "error: " << s.message() << "\n";
    return kExitFailed;
  }
  out << TraceSummary(*trace);
  if (!args.output.empty()) out << "wrote " << args.output << " (open it in ui.perfetto.dev)\n";
  if (!args.svg.empty()) out << "wrote " << args.svg << "\n";
  return kExitOk;
}

int Doctor(const TraceArgs& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::JobTrace> trace = LoadTrace(args.source, args.coordinator);
  if (!trace.ok()) return TraceLoadError(trace.status(), err);
  // A job on the coordinator: its plan (summary) and the workers of its
  // latest attempt, by slot (replica 0's stage j at slot j).
  std::map<std::string, double> summary;
  std::vector<std::string> workers;
  if (!IsFileSource(args.source)) {
    client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
    if (absl::StatusOr<v1::JobStatus> st = client.GetJob(trace->job_id()); st.ok()) {
      summary = {st->summary().begin(), st->summary().end()};
      if (st->attempts_size() > 0) {
        const v1::JobAttempt& a = st->attempts(st->attempts_size() - 1);
        for (int j = 0; j < st->num_stages() && j < a.workers_size(); ++j) {
          workers.push_back(a.workers(j));
        }
      }
    }
  }
  out << DiagnosisText(*trace, Diagnose(*trace, summary), workers);
  return kExitOk;
}

}  // namespace stagewise::cli
