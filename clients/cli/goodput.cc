// `stagewise goodput [JOB]`: where worker-seconds went (GetGoodput;
// docs/operations.md, "Goodput"): productive steps, pipeline bubbles,
// startup and placement, checkpoints, recovery and redone steps, and the
// demand that waited in the queue; for the cluster also its idle time.
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
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

struct GoodputArgs {
  std::string coordinator;
  std::string job_id;  // "": the cluster
  std::string output = "text";
};

// (use, worker-seconds) in the order they are shown.
std::vector<std::pair<std::string, double>> Uses(const v1::Goodput& g) {
  std::vector<std::pair<std::string, double>> uses = {
      {"productive", g.productive_worker_seconds()}, {"bubble", g.bubble_worker_seconds()},
      {"startup", g.startup_worker_seconds()},       {"checkpoint", g.checkpoint_worker_seconds()},
      {"recovery", g.recovery_worker_seconds()},
  };
  if (g.job_id().empty()) {
    uses.emplace_back("idle_waiting", g.idle_waiting_worker_seconds());
    uses.emplace_back("idle_unqueued", g.idle_unqueued_worker_seconds());
  }
  return uses;
}

int ShowGoodput(const GoodputArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::Goodput> g = client.GetGoodput(args.job_id);
  if (!g.ok()) return ReportError(g.status(), err);
  const bool cluster = args.job_id.empty();
  // Shares of the held time for a job, of the registered time for the cluster.
  const double whole = cluster ? g->registered_worker_seconds() : g->held_worker_seconds();
  if (args.output == "json") {
    Json uses = Json::object();
    for (const auto& [use, seconds] : Uses(*g)) uses[use] = Number(seconds);
    out << JsonLine({{"schema_version", kSchemaVersion},
                     {"job_id", cluster ? Json() : Json(g->job_id())},
                     {"worker_seconds", uses},
                     {"held_worker_seconds", Number(g->held_worker_seconds())},
                     {"registered_worker_seconds",
                      cluster ? Number(g->registered_worker_seconds()) : Json()},
                     {"queued_worker_seconds", Number(g->queued_worker_seconds())},
                     {"goodput", Number(g->goodput())},
                     {"compute_share", Number(g->compute_share())},
                     {"since_unix_ms", cluster ? Json(g->since_unix_ms()) : Json()}})
        << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& [use, seconds] : Uses(*g)) {
    rows.push_back({use, absl::StrFormat("%.1f", seconds),
                    whole > 0 ? absl::StrFormat("%.1f%%", 100 * seconds / whole) : "-"});
  }
  out << (cluster ? absl::StrFormat("cluster, since %s ago\n",
                                    HumanDuration(absl::ToDoubleSeconds(
                                        absl::Now() - absl::FromUnixMillis(g->since_unix_ms()))))
                  : absl::StrFormat("job %s\n", g->job_id()));
  out << RenderTable({"USE", "WORKER-SECONDS", cluster ? "OF REGISTERED" : "OF HELD"}, rows);
  out << absl::StrFormat(
      "goodput %.1f%%: in training steps (productive + bubble), of %s\n"
      "within the steps %.1f%% computed, %.1f%% waited for neighbours (bubble)\n"
      "waited in the queue: %.1f worker-seconds asked for\n",
      100 * g->goodput(),
      cluster ? "the registered time less the idle time with nothing queued" : "the held time",
      100 * g->compute_share(), 100 * (1 - g->compute_share()), g->queued_worker_seconds());
  return kExitOk;
}

}  // namespace

void AddGoodputCommand(CommandSet& set) {
  auto args = std::make_shared<GoodputArgs>();
  CLI::App* cmd =
      set.Add("goodput",
              "Where worker-seconds went: productive steps, pipeline bubbles, startup and\n"
              "placement, checkpoints, recovery and redone steps (and, for the cluster, idle\n"
              "time while jobs waited or with nothing queued). Without JOB: the cluster since\n"
              "the coordinator started",
              [args](Invocation& run) {
                return run.WithCoordinator([&](const std::string& coordinator) {
                  args->coordinator = coordinator;
                  return ShowGoodput(*args, run.out(), run.err());
                });
              });
  cmd->add_option("job", args->job_id, "A job id (default: the whole cluster)");
  AddOutputOption(cmd, args->output, "Output format");
}

}  // namespace stagewise::cli
