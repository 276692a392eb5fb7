// stagewise: the command-line client. Parses flags and dispatches; the
// commands live in the stagewise_cli library.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "clients/cli/commands.h"
#include "clients/cli/config_file.h"
#include "clients/cli/conventions.h"
#include "clients/cli/flags.h"
#include "clients/client/coordinator_client.h"
#include "services/metrics/metrics.h"
#include "services/rpc/tls.h"
#include "services/spec/enums.h"

int main(int argc, char** argv) {
  using namespace stagewise::cli;
  CLI::App app{
      "stagewise: train one neural network across many machines, with exact pipelined\n"
      "backpropagation or decoupled algorithms (PETRA, delayed gradients, features replay,\n"
      "N-wise interlocking backpropagation, auxiliary-variable networks).\n"
      "Job files are YAML; see docs/job_spec.md and examples/."};
  app.require_subcommand(1);
  app.set_version_flag("--version", VersionString());
  // Lets the global --coordinator also come after the subcommand.
  app.fallthrough();
  std::string coordinator;
  app.add_option("--coordinator", coordinator,
                 "Coordinator address HOST:PORT (default: $STAGEWISE_COORDINATOR, else "
                 "127.0.0.1:7070)");
  // Transport security and the bearer token of the commands that talk to a
  // coordinator (global: they may also come after the subcommand).
  stagewise::rpc::TlsConfig tls;
  stagewise::rpc::AddTlsFlags(&app, &tls);
  std::string token;
  app.add_option("--token", token,
                 "Bearer token for the coordinator (env STAGEWISE_TOKEN); its role decides what "
                 "this client may do (read, submit, admin)")
      ->envname("STAGEWISE_TOKEN");
  std::string context_name;
  app.add_option("--context", context_name,
                 "The config file's context to talk to (env STAGEWISE_CONTEXT; default: its "
                 "current-context). Flags and environment variables win over it")
      ->envname("STAGEWISE_CONTEXT");
  const auto set_option = [](CLI::App* cmd, std::vector<std::string>& sets) {
    AddSetOption(cmd, sets);
  };
  const auto output_option = [](CLI::App* cmd, std::string& output, const char* what) {
    AddOutputOption(cmd, output, what);
  };

  // An old spelling that keeps working, hidden from --help; Deprecated()
  // below says what replaces it (-o names an output format everywhere).
  const auto old_spelling = [](CLI::App* cmd, const std::string& names, std::string& value) {
    return cmd->add_option(names, value)->group("");
  };

  auto* version = app.add_subcommand("version", "Print the version and the libraries built in");

  TrainLocalArgs train;
  auto* train_cmd = app.add_subcommand(
      "train-local",
      "Train a job in this process with plain backpropagation (the reference trainer)");
  train_cmd->add_option("job", train.job_path, "Job spec (YAML)")
      ->required()
      ->check(CLI::ExistingFile);
  output_option(train_cmd, train.output, "Result format");
  train_cmd->add_option("--threads", train.threads, "CPU threads for LibTorch (0 = all cores)")
      ->capture_default_str();
  train_cmd->add_option("--steps", train.steps,
                        "Train this many steps instead of the spec's budget");
  train_cmd->add_option("--epochs", train.epochs,
                        "Train this many epochs instead of the spec's budget");
  train_cmd->add_option("--log-every", train.log_every, "Steps between progress lines")
      ->capture_default_str();
  train_cmd->add_flag("!--no-resume", train.resume,
                      "Start fresh even when checkpoint.dir holds a checkpoint");
  train_cmd->add_flag("-q,--quiet", train.quiet, "Print only the result");
  set_option(train_cmd, train.sets);

  ValidateArgs validate;
  auto* validate_cmd = app.add_subcommand(
      "validate", "Check a job spec and print its model's blocks and stage partition");
  validate_cmd->add_option("job", validate.job_path, "Job spec (YAML)")
      ->required()
      ->check(CLI::ExistingFile);
  output_option(validate_cmd, validate.output, "Output format");
  set_option(validate_cmd, validate.sets);

  SubmitArgs submit;
  auto* submit_cmd =
      app.add_subcommand("submit", "Submit a job to the coordinator and follow it to its end");
  submit_cmd->add_option("job", submit.job_path, "Job spec (YAML)")
      ->required()
      ->check(CLI::ExistingFile);
  submit_cmd->add_flag("!--no-wait", submit.wait, "Print the job id and return at once");
  submit_cmd->add_flag("-q,--quiet", submit.quiet, "No progress, only the result");
  output_option(submit_cmd, submit.output, "Result format");
  set_option(submit_cmd, submit.sets);
  const auto reconnect_option = [](CLI::App* cmd, std::string& value) {
    cmd->add_option("--reconnect-timeout", value,
                    "When the coordinator goes away while following the job (a restart), "
                    "reconnect for up to this long (e.g. 10m, 90s; 0 = give up at once)")
        ->capture_default_str();
  };
  reconnect_option(submit_cmd, submit.reconnect_timeout);

  JobArgs status;
  auto* status_cmd = app.add_subcommand("status", "Show one job's state and metrics");
  status_cmd->add_option("job_id", status.job_id, "Job id")->required();
  output_option(status_cmd, status.output, "Output format");

  ListArgs list;
  auto* list_cmd = app.add_subcommand("list", "List jobs, newest first");
  list_cmd
      ->add_option("--limit", list.limit,
                   "At most this many jobs, newest first (0 = every job; fetched 1000 at a time)")
      ->check(CLI::NonNegativeNumber);
  output_option(list_cmd, list.output, "Output format");

  JobArgs watch;
  auto* watch_cmd = app.add_subcommand("watch", "Follow a job's progress until it ends");
  watch_cmd->add_option("job_id", watch.job_id, "Job id")->required();
  watch_cmd->add_flag("-q,--quiet", watch.quiet, "No progress, only the result");
  output_option(watch_cmd, watch.output, "Result format");
  reconnect_option(watch_cmd, watch.reconnect_timeout);

  CancelArgs cancel;
  auto* cancel_cmd = app.add_subcommand("cancel", "Cancel a job");
  cancel_cmd->add_option("job_id", cancel.job_id, "Job id")->required();
  cancel_cmd->add_option("--reason", cancel.reason, "Why (recorded with the job)");
  output_option(cancel_cmd, cancel.output, "Output format");

  WorkersArgs workers;
  auto* workers_cmd =
      app.add_subcommand("workers", "List the workers registered with the coordinator");
  output_option(workers_cmd, workers.output, "Output format");

  CheckpointsArgs checkpoints;
  auto* checkpoints_cmd = app.add_subcommand(
      "checkpoints",
      "List a job's committed checkpoints (step, phase, time, size, path) and the step\n"
      "directories that were skipped, with the reason");
  checkpoints_cmd->add_option("job_id", checkpoints.job_id, "Job id")->required();
  output_option(checkpoints_cmd, checkpoints.output, "Output format");

  JobArgs events;
  auto* events_cmd = app.add_subcommand(
      "events",
      "A job's event log, oldest first: its submission, every state change with its reason\n"
      "(placement, recoveries and their causes, planned stops, the end) and the notes within\n"
      "a state (planned, checkpoints committed, refusals such as \"not rebalancing: ...\")");
  events_cmd->add_option("job_id", events.job_id, "Job id")->required();
  output_option(events_cmd, events.output, "Output format");

  ExportArgs export_args;
  auto* export_cmd = app.add_subcommand(
      "export",
      "Write a committed checkpoint's weights as one whole-model file DIR/model.pt (plus\n"
      "job.yaml and README.txt), checking every shard. With JOB_ID the coordinator names the\n"
      "checkpoint, whose files are then read HERE: run it where checkpoint.dir is mounted at\n"
      "the coordinator's path. --checkpoint reads a checkpoint directory offline.");
  export_cmd->add_option("job_id", export_args.job_id,
                         "Job id (asks the coordinator; not with --checkpoint)");
  export_cmd->add_option("--checkpoint", export_args.checkpoint,
                         "A checkpoint's step directory (<checkpoint.dir>/<job id>/step-...), or "
                         "a job's checkpoint directory (then its newest checkpoint, or --step)");
  export_cmd
      ->add_option("--step", export_args.step,
                   "The checkpoint taken after this step (default: the newest committed one)")
      ->check(CLI::NonNegativeNumber);
  export_cmd->add_option("--output-dir", export_args.out_dir,
                         "Directory to write model.pt, job.yaml and README.txt to (created; "
                         "required)");
  std::string export_old_dir;
  auto* export_old = old_spelling(export_cmd, "-o", export_old_dir);

  PlotArgs plot_args;
  auto* plot_cmd = app.add_subcommand(
      "plot",
      "Draw training curves with gnuplot: loss and test accuracy against steps and wall time,\n"
      "every job on shared axes (compare backprop and petra on one picture). A SOURCE is a job\n"
      "id (its history comes from the coordinator) or a file `stagewise local --history`\n"
      "wrote.");
  plot_cmd->add_option("sources", plot_args.sources, "Job ids or history files")->required();
  plot_cmd->add_option("--output-file", plot_args.output,
                       "The picture: FILE.svg or FILE.png (required)");
  std::string plot_old_file;
  auto* plot_old = old_spelling(plot_cmd, "-o,--output", plot_old_file);
  plot_cmd->add_option("--title", plot_args.title, "Title above the panels")->capture_default_str();

  TraceArgs trace_args;
  auto* trace_cmd = app.add_subcommand(
      "trace",
      "A job's pipeline timeline: what every stage's compute thread did, step by step\n"
      "(forward, backward, rebuild, optimizer step, waiting, sending, evaluation). Needs a\n"
      "`trace:` section in the job (`local --trace` adds one). Prints a summary per stage;\n"
      "--output-file writes Chrome trace JSON (ui.perfetto.dev, chrome://tracing), --svg the\n"
      "pipeline "
      "diagram. SOURCE is a job id on the coordinator or a JSON file this command or\n"
      "`stagewise local --trace` wrote.");
  trace_cmd->add_option("source", trace_args.source, "Job id or trace JSON file")->required();
  trace_cmd->add_option("--output-file", trace_args.output, "Write Chrome trace JSON here");
  std::string trace_old_file;
  auto* trace_old = old_spelling(trace_cmd, "-o,--output", trace_old_file);
  trace_cmd->add_option("--svg", trace_args.svg, "Draw the pipeline diagram here (FILE.svg)");

  TraceArgs doctor_args;
  auto* doctor_cmd = app.add_subcommand(
      "doctor",
      "Where a pipeline loses its time, from its trace: per stage how busy it is, how long it\n"
      "waits for its neighbours and its longest wait; the stage the others wait on when one\n"
      "stands out (busy 1.15x the median stage or more); a stage that computes 1.25x its\n"
      "plan's prediction or more (planned jobs). SOURCE as for `trace`; a job id also names\n"
      "each stage's worker.");
  doctor_cmd->add_option("source", doctor_args.source, "Job id or trace JSON file")->required();

  LocalArgs local;
  CLI::App* local_cmd = AddLocalCommand(app, local);

  PlanArgs plan;
  auto* plan_cmd = app.add_subcommand(
      "plan",
      "Profile the job's model here (cached per model, batch size, device and threads) and\n"
      "print the partition, per-stage time and memory, the store/rebuild mode of every\n"
      "reversible block and each algorithm's predicted time per mini-batch");
  plan_cmd->add_option("job", plan.job_path, "Job spec (YAML)")
      ->required()
      ->check(CLI::ExistingFile);
  set_option(plan_cmd, plan.sets);
  plan_cmd->add_option("--memory-budget", plan.memory_budget,
                       "Memory cap per worker, e.g. 2GiB or 512MiB (default: the job's "
                       "stages.memory_budget; none: no cap)");
  plan_cmd
      ->add_option("--modes", plan.modes,
                   "Reversible blocks: auto (knapsack under the cap), store or rebuild "
                   "(default: the job's stages.modes)")
      ->check(CLI::IsMember(stagewise::EnumNames<stagewise::BlockModes>()));
  plan_cmd
      ->add_option("--partition", plan.partition,
                   "job: the job's partition (auto ones are planned); auto: plan it anyway")
      ->check(CLI::IsMember({"job", "auto"}))
      ->capture_default_str();
  plan_cmd
      ->add_option("--batch-sizes", plan.batch_sizes,
                   "Sweep these batch sizes and pick the best time per sample")
      ->delimiter(',');
  plan_cmd
      ->add_option("--threads", plan.threads,
                   "LibTorch threads while profiling (default: max(1, cores / stages), as "
                   "`local` gives each worker)")
      ->check(CLI::PositiveNumber);
  plan_cmd->add_option("--device", plan.device, "Device to profile on (cpu, cuda:0)")
      ->capture_default_str();
  plan_cmd
      ->add_option(
          "--repeats", plan.repeats,
          "Timed rounds per figure (every figure once per round; the lower quartile is kept)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  plan_cmd
      ->add_option("--warmup", plan.warmup,
                   "Untimed rounds before the timed ones (0 for a quick, rougher profile)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  plan_cmd->add_option("--cache-dir", plan.cache_dir,
                       "Profile cache (default: $STAGEWISE_PROFILE_CACHE, else "
                       "~/.cache/stagewise/profiles)");
  plan_cmd->add_flag("--refresh", plan.refresh, "Profile again even when a cached profile exists");
  plan_cmd->add_flag("!--no-profile", plan.show_profile, "Do not print the per-block profile");
  plan_cmd->add_flag("-q,--quiet", plan.quiet, "No progress on stderr");
  output_option(plan_cmd, plan.output, "Output format");

  ConfigArgs config_args;
  auto* config_cmd = app.add_subcommand(
      "config",
      "Contexts: named coordinators with their token file and certificates, kept in\n"
      "~/.config/stagewise/config.yaml ($STAGEWISE_CONFIG); the current one is used when\n"
      "no --coordinator, --token or --tls-* flag (or variable) says otherwise");
  config_cmd->require_subcommand(1);
  config_cmd->add_subcommand("get-contexts", "List the contexts (* marks the current one)");
  config_cmd->add_subcommand("current-context", "Print the current context's name");
  config_cmd->add_subcommand("use-context", "Make NAME the current context")
      ->add_option("name", config_args.name, "Context name")
      ->required();
  config_cmd->add_subcommand("delete-context", "Remove context NAME")
      ->add_option("name", config_args.name, "Context name")
      ->required();
  auto* set_context_cmd = config_cmd->add_subcommand(
      "set-context",
      "Create or update context NAME from the flags given with it: --coordinator,\n"
      "--token-file, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --insecure (the\n"
      "others are kept). The first context becomes the current one");
  set_context_cmd->add_option("name", config_args.name, "Context name")->required();
  set_context_cmd->add_option("--token-file", config_args.set.token_file,
                              "A file holding the bearer token (kept as a path, not copied)");

  BackupArgs backup;
  auto* admin_cmd =
      app.add_subcommand("admin", "The coordinator's upkeep (admin token): `admin backup FILE`");
  admin_cmd->require_subcommand(1);
  auto* backup_cmd = admin_cmd->add_subcommand(
      "backup",
      "Copy the coordinator's database while it runs (SQLite's online backup) to FILE on\n"
      "this machine; restore it by starting a stopped coordinator on it (--db FILE).\n"
      "See deploy/README.md, \"Backing up the database\"");
  backup_cmd->add_option("file", backup.file, "Where the copy goes (must not exist)")->required();
  backup_cmd->add_flag("-q,--quiet", backup.quiet, "No progress lines");

  std::string shell;
  auto* completion_cmd = app.add_subcommand(
      "completion",
      "Print a shell completion script (commands, their options, file names):\n"
      "  bash: source <(stagewise completion bash)   (or save it under\n"
      "        /etc/bash_completion.d/ or ~/.local/share/bash-completion/completions/stagewise)\n"
      "  zsh:  source <(stagewise completion zsh)    (uses bashcompinit)");
  completion_cmd->add_option("shell", shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));

  std::vector<std::string> label_jobs;
  std::string label_key_file;
  auto* label_cmd = app.add_subcommand(
      "metrics-label",
      "Print the job label /metrics uses for each job id under --metrics-job-ids hashed "
      "(to find a job on a dashboard)");
  label_cmd->add_option("jobs", label_jobs, "Job ids")->required();
  label_cmd
      ->add_option("--key-file", label_key_file,
                   "The --metrics-job-key-file of the coordinator and the workers")
      ->required();

  // An unknown command is an error, even with --help after it (CLI11 would
  // print the top-level help and succeed).
  {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (const auto unknown = FindUnknownCommand(app, args)) {
      const std::string at = unknown->parent.empty() ? "" : unknown->parent + " ";
      std::cerr << "error: unknown command '" << at << unknown->word << "'"
                << (unknown->closest.empty() ? ""
                                             : "; did you mean '" + at + unknown->closest + "'?")
                << "\n"
                << "Run 'stagewise " << at << "--help' for the commands.\n";
      return kExitInvalid;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitInvalid;
  }
  if (version->parsed()) {
    std::cout << VersionString() << "\n";
    return kExitOk;
  }
  if (config_cmd->parsed()) {
    for (const CLI::App* sub : config_cmd->get_subcommands()) config_args.action = sub->get_name();
    // set-context takes the global flags given on this command line (not
    // their environment variables).
    struct Given {
      const CLI::Option* option;
      const std::string* value;  // the parsed flag (set-context's own: already in place)
      std::string* field;
    };
    const Given given[] = {
        {app.get_option("--coordinator"), &coordinator, &config_args.set.coordinator},
        {app.get_option("--tls-ca"), &tls.ca_file, &config_args.set.tls_ca},
        {app.get_option("--tls-cert"), &tls.cert_file, &config_args.set.tls_cert},
        {app.get_option("--tls-key"), &tls.key_file, &config_args.set.tls_key},
        {app.get_option("--tls-server-name"), &tls.server_name, &config_args.set.tls_server_name},
        {set_context_cmd->get_option("--token-file"), nullptr, nullptr}};
    for (const Given& g : given) {
      if (g.option->count() == 0) continue;
      config_args.given.push_back(g.option->get_lnames().front());
      if (g.field != nullptr) *g.field = *g.value;
    }
    if (app.get_option("--insecure")->count() > 0) {
      config_args.given.push_back("insecure");
      config_args.set.insecure = tls.insecure;
    }
    return ConfigCommand(config_args, std::cout, std::cerr);
  }
  if (completion_cmd->parsed()) {
    auto script = CompletionScript(app, shell);
    if (!script.ok()) {
      std::cerr << "error: " << script.status().message() << "\n";
      return kExitInvalid;
    }
    std::cout << *script;
    return kExitOk;
  }
  // The old spellings: the value goes where the new one's would, with a note.
  const auto deprecated = [](const CLI::Option* old, std::string& from, std::string& to,
                             const std::string& was, const std::string& now) {
    if (old->count() == 0) return true;
    std::cerr << "warning: '" << was << "' is deprecated; use '" << now
              << "' (-o names an output format in every command)\n";
    if (!to.empty() && to != from) {
      std::cerr << "error: both '" << was << "' and '" << now << "' given\n";
      return false;
    }
    to = from;
    return true;
  };
  const auto required = [](const std::string& value, const std::string& what) {
    if (!value.empty()) return true;
    std::cerr << "error: " << what << " is required\nRun with --help for more information.\n";
    return false;
  };
  if (export_cmd->parsed() && (!deprecated(export_old, export_old_dir, export_args.out_dir,
                                           "stagewise export -o DIR", "--output-dir DIR") ||
                               !required(export_args.out_dir, "--output-dir"))) {
    return kExitInvalid;
  }
  if (plot_cmd->parsed() && (!deprecated(plot_old, plot_old_file, plot_args.output,
                                         "stagewise plot -o FILE", "--output-file FILE") ||
                             !required(plot_args.output, "--output-file"))) {
    return kExitInvalid;
  }
  if (trace_cmd->parsed() && !deprecated(trace_old, trace_old_file, trace_args.output,
                                         "stagewise trace -o FILE", "--output-file FILE")) {
    return kExitInvalid;
  }
  // -o yaml: the command prints JSON, converted once it has finished.
  const auto formatted = [](std::string& output, const auto& run) -> int {
    if (output != "yaml") return run(std::cout);
    output = "json";
    std::ostringstream json;
    const int rc = run(json);
    auto yaml = JsonToYaml(json.str());
    if (!yaml.ok()) {
      std::cerr << "error: -o yaml: " << yaml.status().message() << "\n";
      std::cout << json.str();
      return rc == kExitOk ? kExitFailed : rc;
    }
    std::cout << *yaml;
    return rc;
  };
  if (label_cmd->parsed()) {
    auto labels = stagewise::metrics::MakeJobLabels("hashed", label_key_file);
    if (!labels.ok()) {
      std::cerr << "error: " << labels.status().message() << "\n";
      return kExitInvalid;
    }
    for (const std::string& job : label_jobs) std::cout << job << " " << labels->Of(job) << "\n";
    return kExitOk;
  }
  if (train_cmd->parsed()) {
    return formatted(train.output,
                     [&](std::ostream& o) { return TrainLocal(train, o, std::cerr); });
  }
  if (validate_cmd->parsed()) {
    return formatted(validate.output,
                     [&](std::ostream& o) { return Validate(validate, o, std::cerr); });
  }
  if (plan_cmd->parsed()) {
    return formatted(plan.output, [&](std::ostream& o) { return Plan(plan, o, std::cerr); });
  }
  if (local_cmd->parsed()) {
    // `local` makes its own throw-away certificates unless --insecure.
    local.insecure = tls.insecure;
    return formatted(local.output, [&](std::ostream& o) { return Local(local, o, std::cerr); });
  }
  // The config file's context fills what no flag or variable gave.
  if (absl::StatusOr<CliConfig> config = LoadConfig(ConfigPath()); !config.ok()) {
    std::cerr << "error: " << config.status().message() << "\n";
    return kExitInvalid;
  } else if (absl::StatusOr<const Context*> ctx = SelectContext(*config, context_name); !ctx.ok()) {
    std::cerr << "error: " << ctx.status().message() << "\n";
    return kExitInvalid;
  } else if (*ctx != nullptr) {
    const Context& c = **ctx;
    const char* env = std::getenv("STAGEWISE_COORDINATOR");
    if (coordinator.empty() && (env == nullptr || *env == '\0')) coordinator = c.coordinator;
    if (token.empty() && !c.token_file.empty()) {
      absl::StatusOr<std::string> t = ReadTokenFile(c.token_file);
      if (!t.ok()) {
        std::cerr << "error: context: " << t.status().message() << "\n";
        return kExitInvalid;
      }
      token = *t;
    }
    const bool tls_given =
        !tls.ca_file.empty() || !tls.cert_file.empty() || !tls.key_file.empty() || tls.insecure;
    if (!tls_given) {
      tls.ca_file = c.tls_ca;
      tls.cert_file = c.tls_cert;
      tls.key_file = c.tls_key;
      tls.insecure = c.insecure;
    }
    if (tls.server_name.empty()) tls.server_name = c.tls_server_name;
  }
  {
    stagewise::rpc::RpcOptions client_options;
    if (absl::Status s = stagewise::rpc::ApplyTls(tls, &client_options); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitInvalid;
    }
    client_options.bearer_token = token;
    stagewise::client::SetDefaultClientOptions(client_options);
  }
  submit.coordinator = status.coordinator = list.coordinator = watch.coordinator =
      cancel.coordinator = workers.coordinator = checkpoints.coordinator = events.coordinator =
          export_args.coordinator = backup.coordinator = coordinator;
  if (submit_cmd->parsed()) {
    return formatted(submit.output, [&](std::ostream& o) { return Submit(submit, o, std::cerr); });
  }
  if (status_cmd->parsed()) {
    return formatted(status.output,
                     [&](std::ostream& o) { return JobStatusCommand(status, o, std::cerr); });
  }
  if (list_cmd->parsed()) {
    return formatted(list.output, [&](std::ostream& o) { return List(list, o, std::cerr); });
  }
  if (watch_cmd->parsed()) {
    return formatted(watch.output, [&](std::ostream& o) { return Watch(watch, o, std::cerr); });
  }
  if (cancel_cmd->parsed()) {
    return formatted(cancel.output, [&](std::ostream& o) { return Cancel(cancel, o, std::cerr); });
  }
  if (workers_cmd->parsed()) {
    return formatted(workers.output,
                     [&](std::ostream& o) { return Workers(workers, o, std::cerr); });
  }
  if (checkpoints_cmd->parsed()) {
    return formatted(checkpoints.output,
                     [&](std::ostream& o) { return Checkpoints(checkpoints, o, std::cerr); });
  }
  if (backup_cmd->parsed()) return AdminBackup(backup, std::cout, std::cerr);
  if (events_cmd->parsed()) {
    return formatted(events.output, [&](std::ostream& o) { return Events(events, o, std::cerr); });
  }
  if (export_cmd->parsed()) return Export(export_args, std::cout, std::cerr);
  if (plot_cmd->parsed()) {
    plot_args.coordinator = coordinator;
    return Plot(plot_args, std::cout, std::cerr);
  }
  if (trace_cmd->parsed()) {
    trace_args.coordinator = coordinator;
    return Trace(trace_args, std::cout, std::cerr);
  }
  if (doctor_cmd->parsed()) {
    doctor_args.coordinator = coordinator;
    return Doctor(doctor_args, std::cout, std::cerr);
  }
  return kExitInvalid;
}
