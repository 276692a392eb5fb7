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
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/conventions.h"
#include "clients/cli/doctor.h"
#include "clients/cli/flags.h"
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

void AddTraceCommands(CommandSet& set) {
  auto trace = std::make_shared<TraceArgs>();
  auto old_file = std::make_shared<std::unique_ptr<DeprecatedSpelling>>();
  CLI::App* trace_cmd = set.Add(
      "trace",
      "A job's pipeline timeline: what every stage's compute thread did, step by step\n"
      "(forward, backward, rebuild, optimizer step, waiting, sending, evaluation). Needs a\n"
      "`trace:` section in the job (`local --trace` adds one). Prints a summary per stage;\n"
      "--output-file writes Chrome trace JSON (ui.perfetto.dev, chrome://tracing), --svg the\n"
      "pipeline diagram. SOURCE is a job id on the coordinator or a JSON file this command or\n"
      "`stagewise local --trace` wrote.",
      [trace, old_file](Invocation& run) {
        if (!(*old_file)->Apply(trace->output, run.err())) return kExitInvalid;
        return run.WithCoordinator([&](const std::string& coordinator) {
          trace->coordinator = coordinator;
          return Trace(*trace, run.out(), run.err());
        });
      });
  trace_cmd->add_option("source", trace->source, "Job id or trace JSON file")->required();
  trace_cmd->add_option("--output-file", trace->output, "Write Chrome trace JSON here");
  *old_file = std::make_unique<DeprecatedSpelling>(trace_cmd, "-o,--output",
                                                   "stagewise trace -o FILE", "--output-file FILE");
  trace_cmd->add_option("--svg", trace->svg, "Draw the pipeline diagram here (FILE.svg)");

  auto doctor = std::make_shared<TraceArgs>();
  CLI::App* doctor_cmd = set.Add(
      "doctor",
      "Where a pipeline loses its time, from its trace: per stage how busy it is, how long it\n"
      "waits for its neighbours and its longest wait; the stage the others wait on when one\n"
      "stands out (busy 1.15x the median stage or more); a stage that computes 1.25x its\n"
      "plan's prediction or more (planned jobs). SOURCE as for `trace`; a job id also names\n"
      "each stage's worker.",
      [doctor](Invocation& run) {
        return run.WithCoordinator([&](const std::string& coordinator) {
          doctor->coordinator = coordinator;
          return Doctor(*doctor, run.out(), run.err());
        });
      });
  doctor_cmd->add_option("source", doctor->source, "Job id or trace JSON file")->required();
}

}  // namespace stagewise::cli
