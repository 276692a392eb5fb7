// The `stagewise` CLI's commands; main.cc only parses flags and calls these.
#ifndef STAGEWISE_CLIENTS_CLI_COMMANDS_H_
#define STAGEWISE_CLIENTS_CLI_COMMANDS_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace stagewise::cli {

class CommandSet;  // command.h

// Exit codes shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;       // the job ran and failed
inline constexpr int kExitInvalid = 2;      // bad spec or arguments
inline constexpr int kExitUnreachable = 3;  // the coordinator did not answer
// Interrupted by SIGINT/SIGTERM: 128 + the signal number (130, 143).

struct TrainLocalArgs {
  std::string job_path;
  std::vector<std::string> sets;  // --set KEY=VALUE, applied to the job file in order
  std::string output = "text";    // text | json
  int threads = 0;                // 0 = every core
  int64_t steps = -1;             // overrides the spec when >= 0
  double epochs = -1;             // overrides the spec when >= 0
  int64_t log_every = 50;
  bool resume = true;
  bool quiet = false;
};

struct ValidateArgs {
  std::string job_path;
  std::vector<std::string> sets;  // --set KEY=VALUE, applied to the job file in order
  std::string output = "text";
};

// Commands that talk to a coordinator. `coordinator` is the --coordinator
// flag ("" = $STAGEWISE_COORDINATOR, else 127.0.0.1:7070).
// --reconnect-timeout: how long `submit` and `watch` wait for a coordinator
// that went away mid-watch ("0" = give up at once).
inline constexpr char kDefaultReconnectTimeout[] = "10m";

struct SubmitArgs {
  std::string coordinator;
  std::string job_path;
  std::vector<std::string> sets;  // --set KEY=VALUE, applied to the job file in order
  bool wait = true;
  bool quiet = false;
  bool suspended = false;  // --suspended: released later by `stagewise resume`
  std::string output = "text";
  std::string reconnect_timeout = kDefaultReconnectTimeout;
};

struct JobArgs {  // status, watch
  std::string coordinator;
  std::string job_id;
  bool quiet = false;
  std::string output = "text";
  std::string reconnect_timeout = kDefaultReconnectTimeout;
};

// `admin backup FILE`: an online copy of the coordinator's database.
struct BackupArgs {
  std::string coordinator;
  std::string file;
  bool quiet = false;
};

struct CheckpointsArgs {
  std::string coordinator;
  std::string job_id;
  std::string output = "text";
};

// `export`: a committed checkpoint's shards -> one whole-model file. Either
// `job_id` (the coordinator names the checkpoint's files, which must be
// readable here) or `checkpoint` (a step directory, or a job's checkpoint
// directory: its newest, or `step`).
struct ExportArgs {
  std::string coordinator;
  std::string job_id;
  std::string checkpoint;
  int64_t step = -1;  // -1 = the newest committed checkpoint
  std::string out_dir;
};

struct ListArgs {
  std::string coordinator;
  int limit = 0;  // 0 = the coordinator's default
  std::string output = "text";
};

struct CancelArgs {
  std::string coordinator;
  std::string job_id;
  std::string reason;
  std::string output = "text";
};

struct ResumeArgs {  // resume: a job submitted suspended
  std::string coordinator;
  std::string job_id;
  std::string output = "text";
};

struct WorkersArgs {
  std::string coordinator;
  std::string output = "text";
};

// `local`: a coordinator and J workers as child processes on loopback.
struct LocalArgs {
  std::string job_path;
  std::vector<std::string> sets;  // --set KEY=VALUE, applied to the job file in order
  int workers = 0;                // 0 = the job's stage count
  int threads = 0;                // LibTorch threads per worker; 0 = max(1, cores / workers)
  bool keep_logs = false;
  bool quiet = false;
  std::string output = "text";
  int64_t steps = -1;  // >= 1: run this many steps (each phase, with phases)
  // Fault injection: kill -9 and restart this many workers / coordinators at
  // random moments while the job runs (needs checkpoint.dir).
  int chaos = 0;
  int chaos_coordinator = 0;
  uint64_t chaos_seed = 0;  // 0 = pick one (printed)
  // Plaintext on loopback instead of mutual TLS with throw-away certificates.
  bool insecure = false;
  // The coordinator's status pages on this loopback address ("" = off); a
  // job without a trace section then gets `trace: {}` (the page's timeline).
  std::string web;
  // With `web`, how long the pages stay up after the job ends: < 0 until
  // Ctrl-C (the default), 0 not at all, else this many seconds.
  double web_linger = -1;
  // Where to write the job's metric history at the end (for `plot`); "" = nowhere.
  std::string history;
  // Where to write the job's pipeline timeline at the end: Chrome trace JSON
  // and the SVG diagram ("" = nowhere). Either adds `trace: {}` to a job
  // without a trace section.
  std::string trace;
  std::string timeline;
  // Each worker's device (--devices, cycled over the workers); empty: from
  // the job's `device` (clients/cli/devices.h).
  std::vector<std::string> devices;
};

// `trace`: a job's pipeline timeline (a job id on a coordinator, or a trace
// file) as Chrome trace JSON, an SVG diagram and a summary.
struct TraceArgs {
  std::string coordinator;
  std::string source;
  std::string output;  // JSON; "" = none
  std::string svg;     // "" = none
};

// `plot`: training curves of jobs (ids on a coordinator, or history files).
struct PlotArgs {
  std::string coordinator;
  std::vector<std::string> sources;
  std::string output;
  std::string title = "training curves";
};

// `plan`: profile here (cached) and plan the job's partition and modes.
struct PlanArgs {
  std::string job_path;
  std::vector<std::string> sets;     // --set KEY=VALUE, applied to the job file in order
  std::string memory_budget;         // "" = the job's stages.memory_budget
  std::string modes;                 // "" = the job's stages.modes
  std::string partition = "job";     // job | auto
  std::vector<int64_t> batch_sizes;  // sweep; empty = the job's batch size
  int threads = 0;                   // 0 = max(1, cores / stages), as `local`
  std::string device = "cpu";
  int repeats = 5;
  int warmup = 2;         // untimed rounds before the timed ones
  std::string cache_dir;  // "" = planner::DefaultProfileCacheDir()
  bool refresh = false;
  bool show_profile = true;
  bool quiet = false;
  std::string output = "text";
};

std::string VersionString();
int TrainLocal(const TrainLocalArgs& args, std::ostream& out, std::ostream& err);
int Validate(const ValidateArgs& args, std::ostream& out, std::ostream& err);
int Submit(const SubmitArgs& args, std::ostream& out, std::ostream& err);
int JobStatusCommand(const JobArgs& args, std::ostream& out, std::ostream& err);
int Watch(const JobArgs& args, std::ostream& out, std::ostream& err);
int List(const ListArgs& args, std::ostream& out, std::ostream& err);
int Cancel(const CancelArgs& args, std::ostream& out, std::ostream& err);
int Resume(const ResumeArgs& args, std::ostream& out, std::ostream& err);
int Workers(const WorkersArgs& args, std::ostream& out, std::ostream& err);
int Checkpoints(const CheckpointsArgs& args, std::ostream& out, std::ostream& err);
// `stagewise admin backup FILE` (BackupDatabase, admin role).
int AdminBackup(const BackupArgs& args, std::ostream& out, std::ostream& err);
// `stagewise events JOB`: the job's event log (ListJobEvents).
int Events(const JobArgs& args, std::ostream& out, std::ostream& err);
int Export(const ExportArgs& args, std::ostream& out, std::ostream& err);
int Local(const LocalArgs& args, std::ostream& out, std::ostream& err);
int Plot(const PlotArgs& args, std::ostream& out, std::ostream& err);
int Trace(const TraceArgs& args, std::ostream& out, std::ostream& err);
// `doctor SOURCE`: the trace read for its bottleneck (clients/cli/doctor.h).
int Doctor(const TraceArgs& args, std::ostream& out, std::ostream& err);
int Plan(const PlanArgs& args, std::ostream& out, std::ostream& err);

// Each adds its command(s), flags bound to its options struct, to `set`; in
// the order `stagewise --help` lists them (AddAllCommands).
void AddVersionCommand(CommandSet& set);       // version.cc
void AddTrainLocalCommand(CommandSet& set);    // train_local.cc
void AddValidateCommand(CommandSet& set);      // validate.cc
void AddRemoteCommands(CommandSet& set);       // remote.cc: submit, status, list, watch,
                                               // cancel, workers, checkpoints, events, admin
void AddExportCommand(CommandSet& set);        // export.cc
void AddPlotCommand(CommandSet& set);          // plot.cc
void AddQueueCommand(CommandSet& set);         // queue.cc
void AddGoodputCommand(CommandSet& set);       // goodput.cc
void AddTraceCommands(CommandSet& set);        // trace.cc: trace, doctor
void AddLocalCommand(CommandSet& set);         // local.cc
void AddPlanCommand(CommandSet& set);          // plan.cc
void AddConfigCommand(CommandSet& set);        // config_command.cc
void AddCompletionCommand(CommandSet& set);    // completion.cc
void AddMetricsLabelCommand(CommandSet& set);  // version.cc
void AddAllCommands(CommandSet& set);          // command.cc

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_COMMANDS_H_
