// `stagewise queue`: the jobs waiting to be placed, in the coordinator's
// queue order, with what each waits for (JobStatus.queue_position and
// reason), then the suspended ones and those settling after a loss; and
// `stagewise priority JOB CLASS`, which moves a waiting job to another class.
#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/flags.h"
#include "clients/cli/format.h"
#include "clients/cli/job_format.h"
#include "clients/cli/job_watch.h"
#include "clients/cli/output.h"
#include "clients/client/coordinator_client.h"

namespace stagewise::cli {
namespace {

struct QueueArgs {
  std::string coordinator;
  std::string output = "text";
};

struct PriorityArgs {
  std::string coordinator;
  std::string job_id;
  std::string priority;
  std::string output = "text";
};

int Priority(const PriorityArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::JobStatus> status = client.SetPriority(args.job_id, args.priority);
  if (!status.ok()) return ReportError(status.status(), err);
  if (args.output == "json") {
    out << JobJson(*status) << "\n";
  } else {
    out << "job " << status->job_id() << ": class " << status->priority() << " ("
        << client::JobStateName(status->state()) << ")\n";
  }
  return kExitOk;
}

bool Waiting(const v1::JobStatus& s) {
  return s.state() == v1::PENDING || s.state() == v1::RECOVERING;
}

// Queued ones by place, then the rest (suspended, settling) oldest first.
std::vector<v1::JobStatus> QueueOrder(std::vector<v1::JobStatus> jobs) {
  jobs.erase(std::remove_if(jobs.begin(), jobs.end(), [](const auto& s) { return !Waiting(s); }),
             jobs.end());
  std::stable_sort(jobs.begin(), jobs.end(), [](const v1::JobStatus& a, const v1::JobStatus& b) {
    const int pa = a.queue_position() > 0 ? a.queue_position() : 1 << 30;
    const int pb = b.queue_position() > 0 ? b.queue_position() : 1 << 30;
    if (pa != pb) return pa < pb;
    return a.created_unix_ms() < b.created_unix_ms();
  });
  return jobs;
}

int Workers(const v1::JobStatus& s) {
  return std::max(1, s.num_stages()) * std::max(1, s.num_replicas()) /
         std::max(1, s.chunks_per_worker());
}

int Queue(const QueueArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client.ListJobs(0);
  if (!jobs.ok()) return ReportError(jobs.status(), err);
  const std::vector<v1::JobStatus> waiting = QueueOrder(*std::move(jobs));
  const absl::Time now = absl::Now();
  if (args.output == "json") {
    Json list = Json::array();
    for (const v1::JobStatus& s : waiting) {
      list.push_back({{"position", s.queue_position() > 0 ? Json(s.queue_position()) : Json()},
                      {"job_id", s.job_id()},
                      {"name", s.name()},
                      {"owner", NonEmpty(s.owner())},
                      {"priority", NonEmpty(s.priority())},
                      {"state", client::JobStateName(s.state())},
                      {"suspended", s.suspended()},
                      {"workers", Workers(s)},
                      {"waiting_seconds", Number(absl::ToDoubleSeconds(
                                              now - absl::FromUnixMillis(s.created_unix_ms())))},
                      {"reason", NonEmpty(s.reason())}});
    }
    out << JsonLine({{"schema_version", kSchemaVersion}, {"jobs", list}}) << "\n";
    return kExitOk;
  }
  if (waiting.empty()) {
    err << "no job waits\n";
    return kExitOk;
  }
  // CLASS only where the coordinator has priority classes.
  const bool classes = std::any_of(waiting.begin(), waiting.end(),
                                   [](const v1::JobStatus& s) { return !s.priority().empty(); });
  std::vector<std::vector<std::string>> rows;
  for (const v1::JobStatus& s : waiting) {
    std::vector<std::string> row = {s.queue_position() > 0 ? absl::StrCat(s.queue_position())
                                    : s.suspended()        ? "suspended"
                                                           : "-",
                                    s.job_id(),
                                    s.name(),
                                    s.owner().empty() ? "-" : s.owner(),
                                    client::JobStateName(s.state()),
                                    absl::StrCat(Workers(s)),
                                    HumanAge(now - absl::FromUnixMillis(s.created_unix_ms())),
                                    s.reason().empty() ? "-" : TerminalSafe(s.reason())};
    if (classes) row.insert(row.begin() + 4, s.priority().empty() ? "-" : s.priority());
    rows.push_back(std::move(row));
  }
  std::vector<std::string> header = {"POSITION", "ID",      "NAME", "OWNER",
                                     "STATE",    "WORKERS", "AGE",  "WAITS FOR"};
  if (classes) header.insert(header.begin() + 4, "CLASS");
  out << RenderTable(header, rows);
  return kExitOk;
}

}  // namespace

void AddQueueCommand(CommandSet& set) {
  auto args = std::make_shared<QueueArgs>();
  CLI::App* cmd = set.Add(
      "queue",
      "The jobs waiting to be placed, next first: place in the coordinator's queue, owner,\n"
      "workers wanted, age and what each waits for; then suspended jobs (`submit\n"
      "--suspended`, released by `resume`) and recovering jobs settling after a loss",
      [args](Invocation& run) {
        return run.WithCoordinator([&](const std::string& coordinator) {
          args->coordinator = coordinator;
          return Queue(*args, run.out(), run.err());
        });
      });
  AddOutputOption(cmd, args->output, "Output format");

  auto priority = std::make_shared<PriorityArgs>();
  CLI::App* priority_cmd = set.Add(
      "priority",
      "Moves a job that waits to be placed to another priority class of the coordinator's\n"
      "--scheduling-config (its place in the queue follows at the next pass); a placed job\n"
      "keeps its class (cancel and resubmit to change it)",
      [priority](Invocation& run) {
        return run.WithCoordinator([&](const std::string& coordinator) {
          priority->coordinator = coordinator;
          return Priority(*priority, run.out(), run.err());
        });
      });
  priority_cmd->add_option("job_id", priority->job_id, "Job id")->required();
  priority_cmd->add_option("class", priority->priority, "A priority class")->required();
  AddOutputOption(priority_cmd, priority->output, "Output format");
}

}  // namespace stagewise::cli
