// Text and JSON rendering of coordinator replies (jobs, workers) for the CLI.
#ifndef STAGEWISE_CLIENTS_CLI_JOB_FORMAT_H_
#define STAGEWISE_CLIENTS_CLI_JOB_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "clients/cli/output.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::cli {

std::string HumanBytes(int64_t bytes);   // 8589934592 -> "8.0GiB"
std::string HumanAge(absl::Duration d);  // kubectl style: "45s", "12m", "5h", "3d"

// Columns padded to their widest cell, two spaces apart.
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

// One progress line: state, epoch, step/total, attempt (after a recovery),
// train loss, samples/s, ETA. RECOVERING shows the attempt and the step it
// resumes at.
std::string JobProgressLine(const v1::JobStatus& s, std::optional<double> eta_seconds);

// The full status of one job (submit/watch/local result, `status`). A job
// that was recovered or has a checkpoint also gets its last checkpoint, the
// steps redone and a table of its attempts (times in `tz`).
std::string JobTable(const v1::JobStatus& s, absl::TimeZone tz = absl::LocalTimeZone());
// The job in the output schema (output.h, docs/cli.md "Output schema"), and
// as one line of JSON.
Json JobValue(const v1::JobStatus& s);
std::string JobJson(const v1::JobStatus& s);
// Every key of the job schema, each null, `schema_version` set: commands fill
// what they know (train-local as much as a coordinator's status).
Json JobSkeleton();
// The attempts table alone (ATTEMPT FROM REACHED STARTED DURATION END WORKERS).
std::string AttemptsTable(const v1::JobStatus& s, absl::TimeZone tz);

// `checkpoints`: the committed checkpoints (step, phase, creation time in
// `tz`, size, shards, directory), then the skipped step directories and why.
std::string CheckpointsTable(const v1::ListCheckpointsResponse& r, absl::TimeZone tz);
std::string CheckpointsJson(const std::string& job_id, const v1::ListCheckpointsResponse& r);
// `stagewise events`: one row per event (TIME, EVENT, REASON); EVENT is
// "FROM -> TO" for a transition, the state in parentheses for a note.
std::string EventsTable(const v1::ListJobEventsResponse& r, absl::TimeZone tz);
std::string EventsJson(const std::string& job_id, const v1::ListJobEventsResponse& r);
// The step directory of a checkpoint (its manifest's directory).
std::string CheckpointDir(const v1::CheckpointInfo& c);

std::string JobListTable(const std::vector<v1::JobStatus>& jobs, absl::Time now);
std::string JobListJson(const std::vector<v1::JobStatus>& jobs);

std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers);
std::string WorkersJson(const std::vector<v1::WorkerInfo>& workers);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_JOB_FORMAT_H_
