// The commands that talk to a running coordinator: submit, status, list,
// watch, cancel, workers, checkpoints.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/flags.h"
#include "clients/cli/format.h"
#include "clients/cli/job_format.h"
#include "clients/cli/job_watch.h"
#include "clients/cli/output.h"
#include "clients/cli/script_job.h"
#include "clients/cli/signal_watcher.h"
#include "clients/client/coordinator_client.h"

namespace stagewise::cli {
namespace {

// Follows a submitted job to its end. Ctrl-C stops watching but leaves the job
// running: on a cluster a job is worth more than the terminal that started it.
int WatchUntilDone(client::CoordinatorClient& client, const std::string& job_id, bool quiet,
                   absl::Duration reconnect_timeout, const std::string& output, std::ostream& out,
                   std::ostream& err) {
  SignalWatcher signals([&client](int) { client.StopWatching(); });
  WatchOptions options;
  options.quiet = quiet;
  options.reconnect.give_up_after = reconnect_timeout;
  absl::StatusOr<v1::JobStatus> result = WatchWithProgress(client, job_id, options, err);
  if (const int signo = signals.first_signal(); signo != 0) {
    err << "stopped watching job " << job_id << "; it keeps running (stagewise watch " << job_id
        << ", stagewise cancel " << job_id << ")\n";
    return ExitCodeForSignal(signo);
  }
  if (!result.ok()) return ReportError(result.status(), err);
  return ReportResult(*result, output, out, err);
}

}  // namespace

int Submit(const SubmitArgs& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<absl::Duration> reconnect =
      ParseTimeout(args.reconnect_timeout, "--reconnect-timeout");
  if (!reconnect.ok()) return ReportError(reconnect.status(), err);
  absl::StatusOr<std::string> yaml = ReadJobText(args.job_path, args.sets);
  if (!yaml.ok()) return ReportError(yaml.status(), err);
  // Parsed here too: a torchscript model is dry-run here, where its file is,
  // and should the coordinator (the authority on what it accepts) refuse the
  // job, this parse's errors name the file's lines and columns (or the --set
  // that wrote them), which the coordinator, seeing the job with the
  // assignments applied, cannot.
  absl::StatusOr<JobSpec> spec = ParseJobFile(args.job_path, args.sets);
  if (spec.ok()) {
    if (absl::Status s = PrepareScriptModel(args.job_path, &*spec, &*yaml); !s.ok()) {
      err << "error: " << args.job_path << ": " << TerminalSafe(s.message()) << "\n";
      return kExitInvalid;
    }
  }
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<std::string> job_id = client.Submit(*yaml, args.suspended);
  if (!job_id.ok()) {
    if (job_id.status().code() == absl::StatusCode::kInvalidArgument) {
      const absl::Status& why =
          !spec.ok() && spec.status().code() == absl::StatusCode::kInvalidArgument
              ? spec.status()
              : job_id.status();
      err << "error: " << args.job_path << ": " << TerminalSafeLines(why.message()) << "\n";
      return kExitInvalid;
    }
    return ReportError(job_id.status(), err);
  }
  if (!args.wait || args.suspended) {
    if (args.suspended && !args.quiet && args.output != "json") {
      err << "job " << *job_id << " is suspended: it waits until `stagewise resume " << *job_id
          << "` releases it\n";
    }
    if (args.output == "json") {
      out << JsonLine(Json{{"job_id", *job_id}}) << "\n";
    } else {
      out << *job_id << "\n";
    }
    return kExitOk;
  }
  if (!args.quiet) err << "submitted job " << *job_id << " to " << client.address() << "\n";
  return WatchUntilDone(client, *job_id, args.quiet, *reconnect, args.output, out, err);
}

int Watch(const JobArgs& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<absl::Duration> reconnect =
      ParseTimeout(args.reconnect_timeout, "--reconnect-timeout");
  if (!reconnect.ok()) return ReportError(reconnect.status(), err);
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  return WatchUntilDone(client, args.job_id, args.quiet, *reconnect, args.output, out, err);
}

int JobStatusCommand(const JobArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::JobStatus> status = client.GetJob(args.job_id);
  if (!status.ok()) return ReportError(status.status(), err);
  out << (args.output == "json" ? JobJson(*status) + "\n" : JobTable(*status));
  return kExitOk;
}

int List(const ListArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client.ListJobs(args.limit);
  if (!jobs.ok()) return ReportError(jobs.status(), err);
  if (args.output == "json") {
    out << JobListJson(*jobs) << "\n";
  } else if (jobs->empty()) {
    err << "no jobs\n";
  } else {
    out << JobListTable(*jobs, absl::Now());
  }
  return kExitOk;
}

int Cancel(const CancelArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::JobStatus> status =
      client.Cancel(args.job_id, args.reason.empty() ? "cancelled by the user" : args.reason);
  if (!status.ok()) return ReportError(status.status(), err);
  if (args.output == "json") {
    out << JobJson(*status) << "\n";
  } else {
    out << "job " << status->job_id() << ": " << client::JobStateName(status->state());
    if (!status->reason().empty()) out << " (" << TerminalSafe(status->reason()) << ")";
    out << "\n";
  }
  return kExitOk;
}

int Resume(const ResumeArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::JobStatus> status = client.Resume(args.job_id);
  if (!status.ok()) return ReportError(status.status(), err);
  if (args.output == "json") {
    out << JobJson(*status) << "\n";
  } else {
    out << "job " << status->job_id() << ": released into the queue ("
        << client::JobStateName(status->state()) << ")\n";
  }
  return kExitOk;
}

int Workers(const WorkersArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  if (!workers.ok()) return ReportError(workers.status(), err);
  if (args.output == "json") {
    out << WorkersJson(*workers) << "\n";
  } else if (workers->empty()) {
    err << "no workers registered\n";
  } else {
    out << WorkersTable(*workers);
  }
  return kExitOk;
}

int AdminBackup(const BackupArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  int64_t shown = 0;
  absl::StatusOr<int64_t> bytes =
      client.BackupDatabase(args.file, [&](int64_t done, int64_t total) {
        // A line per 64 MiB and at the end: big databases take a while.
        if (args.quiet || (done - shown < (int64_t{64} << 20) && done != total)) return;
        shown = done;
        err << "backup: " << HumanBytes(done) << " of " << HumanBytes(total) << "\n";
      });
  if (!bytes.ok()) return ReportError(bytes.status(), err);
  out << "backed up the coordinator's database to " << args.file << " (" << HumanBytes(*bytes)
      << ")\n";
  return kExitOk;
}

int Events(const JobArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::ListJobEventsResponse> events = client.ListJobEvents(args.job_id);
  if (!events.ok()) return ReportError(events.status(), err);
  out << (args.output == "json" ? EventsJson(args.job_id, *events) + "\n"
                                : EventsTable(*events, absl::LocalTimeZone()));
  return kExitOk;
}

int Checkpoints(const CheckpointsArgs& args, std::ostream& out, std::ostream& err) {
  client::CoordinatorClient client(client::ResolveCoordinatorAddress(args.coordinator));
  absl::StatusOr<v1::ListCheckpointsResponse> listing = client.ListCheckpoints(args.job_id);
  if (!listing.ok()) return ReportError(listing.status(), err);
  if (args.output == "json") {
    out << CheckpointsJson(args.job_id, *listing) << "\n";
    return kExitOk;
  }
  if (listing->dir().empty()) {
    err << "job " << args.job_id << " keeps no checkpoints (its spec has no checkpoint.dir)\n";
    return kExitOk;
  }
  if (listing->checkpoints().empty()) {
    err << "no committed checkpoints of job " << args.job_id << " in " << listing->dir() << "\n";
  }
  out << CheckpointsTable(*listing, absl::LocalTimeZone());
  return kExitOk;
}

namespace {

void AddReconnectOption(CLI::App* cmd, std::string& value) {
  cmd->add_option("--reconnect-timeout", value,
                  "When the coordinator goes away while following the job (a restart), "
                  "reconnect for up to this long (e.g. 10m, 90s; 0 = give up at once)")
      ->capture_default_str();
}

// A read command about one job: JOB_ID and -o.
using JobCommand = int (*)(const JobArgs&, std::ostream&, std::ostream&);
CLI::App* AddJobCommand(CommandSet& set, const std::string& name, const std::string& description,
                        JobCommand command, std::shared_ptr<JobArgs> args) {
  CLI::App* cmd = set.Add(name, description, [args, command](Invocation& run) {
    return run.WithCoordinator([&](const std::string& coordinator) {
      args->coordinator = coordinator;
      return run.Formatted(args->output,
                           [&](std::ostream& o) { return command(*args, o, run.err()); });
    });
  });
  cmd->add_option("job_id", args->job_id, "Job id")->required();
  AddOutputOption(cmd, args->output, name == "watch" ? "Result format" : "Output format");
  return cmd;
}

// A command whose run function takes the coordinator's address in its
// options struct and prints in args->output.
template <typename Args>
RunCommand Remote(std::shared_ptr<Args> args,
                  int (*command)(const Args&, std::ostream&, std::ostream&)) {
  return [args, command](Invocation& run) {
    return run.WithCoordinator([&](const std::string& coordinator) {
      args->coordinator = coordinator;
      return run.Formatted(args->output,
                           [&](std::ostream& o) { return command(*args, o, run.err()); });
    });
  };
}

void AddSubmitCommand(CommandSet& set) {
  auto args = std::make_shared<SubmitArgs>();
  CLI::App* cmd = set.Add("submit", "Submit a job to the coordinator and follow it to its end",
                          Remote(args, &Submit));
  cmd->add_option("job", args->job_path, "Job spec (YAML)")->required()->check(CLI::ExistingFile);
  cmd->add_flag("!--no-wait", args->wait, "Print the job id and return at once");
  cmd->add_flag("-q,--quiet", args->quiet, "No progress, only the result");
  cmd->add_flag("--suspended", args->suspended,
                "Submit the job suspended: it stays PENDING, outside the queue, until\n"
                "`stagewise resume JOB` releases it; prints the job id and returns");
  AddOutputOption(cmd, args->output, "Result format");
  AddSetOption(cmd, args->sets);
  AddReconnectOption(cmd, args->reconnect_timeout);
}

void AddBackupCommand(CommandSet& set) {
  CLI::App* admin =
      set.Add(nullptr, "admin", "The coordinator's upkeep (admin token): `admin backup FILE`");
  auto args = std::make_shared<BackupArgs>();
  CLI::App* cmd =
      set.Add(admin, "backup",
              "Copy the coordinator's database while it runs (SQLite's online backup) to FILE on\n"
              "this machine; restore it by starting a stopped coordinator on it (--db FILE).\n"
              "See deploy/README.md, \"Backing up the database\"",
              [args](Invocation& run) {
                return run.WithCoordinator([&](const std::string& coordinator) {
                  args->coordinator = coordinator;
                  return AdminBackup(*args, run.out(), run.err());
                });
              });
  cmd->add_option("file", args->file, "Where the copy goes (must not exist)")->required();
  cmd->add_flag("-q,--quiet", args->quiet, "No progress lines");
}

}  // namespace

void AddRemoteCommands(CommandSet& set) {
  AddSubmitCommand(set);
  AddJobCommand(set, "status", "Show one job's state and metrics", &JobStatusCommand,
                std::make_shared<JobArgs>());

  auto list = std::make_shared<ListArgs>();
  CLI::App* list_cmd = set.Add("list", "List jobs, newest first", Remote(list, &List));
  list_cmd
      ->add_option("--limit", list->limit,
                   "At most this many jobs, newest first (0 = every job; fetched 1000 at a time)")
      ->check(CLI::NonNegativeNumber);
  AddOutputOption(list_cmd, list->output, "Output format");

  auto watch = std::make_shared<JobArgs>();
  CLI::App* watch_cmd =
      AddJobCommand(set, "watch", "Follow a job's progress until it ends", &Watch, watch);
  watch_cmd->add_flag("-q,--quiet", watch->quiet, "No progress, only the result");
  AddReconnectOption(watch_cmd, watch->reconnect_timeout);

  auto cancel = std::make_shared<CancelArgs>();
  CLI::App* cancel_cmd = set.Add("cancel", "Cancel a job", Remote(cancel, &Cancel));
  cancel_cmd->add_option("job_id", cancel->job_id, "Job id")->required();
  cancel_cmd->add_option("--reason", cancel->reason, "Why (recorded with the job)");
  AddOutputOption(cancel_cmd, cancel->output, "Output format");

  auto resume = std::make_shared<ResumeArgs>();
  CLI::App* resume_cmd = set.Add(
      "resume",
      "Release a job submitted with `submit --suspended` into the queue (an external queue\n"
      "such as Kueue owns admission: submit suspended, resume when it admits the job)",
      Remote(resume, &Resume));
  resume_cmd->add_option("job_id", resume->job_id, "Job id")->required();
  AddOutputOption(resume_cmd, resume->output, "Output format");

  auto workers = std::make_shared<WorkersArgs>();
  CLI::App* workers_cmd = set.Add("workers", "List the workers registered with the coordinator",
                                  Remote(workers, &Workers));
  AddOutputOption(workers_cmd, workers->output, "Output format");

  auto checkpoints = std::make_shared<CheckpointsArgs>();
  CLI::App* checkpoints_cmd =
      set.Add("checkpoints",
              "List a job's committed checkpoints (step, phase, time, size, path) and the step\n"
              "directories that were skipped, with the reason",
              Remote(checkpoints, &Checkpoints));
  checkpoints_cmd->add_option("job_id", checkpoints->job_id, "Job id")->required();
  AddOutputOption(checkpoints_cmd, checkpoints->output, "Output format");

  AddJobCommand(
      set, "events",
      "A job's event log, oldest first: its submission, every state change with its reason\n"
      "(placement, recoveries and their causes, planned stops, the end) and the notes within\n"
      "a state (planned, checkpoints committed, refusals such as \"not rebalancing: ...\")",
      &Events, std::make_shared<JobArgs>());
  AddBackupCommand(set);
}

}  // namespace stagewise::cli
