// `stagewise train-local`: the single-process reference trainer.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/str_format.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/flags.h"
#include "clients/cli/format.h"
#include "clients/cli/script_job.h"
#include "services/spec/job_spec.h"
#include "services/training/reference_trainer.h"

namespace stagewise::cli {

int TrainLocal(const TrainLocalArgs& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<JobFile> job = OpenJobFile(args.job_path, /*plan=*/false, args.sets);
  if (!job.ok()) {
    err << "error: " << args.job_path << ": " << job.status().message() << "\n";
    return kExitInvalid;
  }
  JobSpec* spec = &job->spec;
  if (args.steps >= 0) {
    spec->steps = args.steps;
    spec->epochs = 0;
  }
  if (args.epochs >= 0) {
    spec->epochs = args.epochs;
    spec->steps = 0;
  }
  if (spec->steps <= 0 && spec->epochs <= 0) {
    err << "error: --steps/--epochs: nothing to train (both are 0)\n";
    return kExitInvalid;
  }
  const int threads =
      args.threads > 0 ? args.threads : static_cast<int>(std::thread::hardware_concurrency());
  torch::set_num_threads(std::max(1, threads));

  const bool json = args.output == "json";
  const bool tty = isatty(fileno(stderr)) != 0;
  if (!args.quiet) {
    err << absl::StrFormat("loading %s data and building %s ...\n", NameOf(spec->data.dataset),
                           NameOf(spec->model.name));
  }
  auto trainer = training::ReferenceTrainer::Create(*spec);
  if (!trainer.ok()) {
    err << "error: " << trainer.status().message() << "\n";
    return trainer.status().code() == absl::StatusCode::kInvalidArgument ? kExitInvalid
                                                                         : kExitFailed;
  }
  if (!args.quiet) {
    err << absl::StrFormat("job %s: %s, %d blocks, %s parameters, %d steps of batch %d on %s\n",
                           spec->name, NameOf(spec->model.name), (*trainer)->model().size(),
                           HumanCount((*trainer)->model().num_parameters()),
                           (*trainer)->total_steps(), spec->batch_size, spec->device);
  }
  training::TrainOptions opts;
  opts.log_every_steps = std::max<int64_t>(1, args.log_every);
  opts.resume = args.resume;
  opts.spec_yaml = job->yaml;
  if (!args.quiet) {
    opts.on_progress = [&](const training::Progress& p) {
      err << (tty ? "\r\033[K" : "") << ProgressLine(p) << (tty ? "" : "\n");
      err.flush();
    };
    opts.on_eval = [&](const training::EvalResult& r) {
      err << (tty ? "\n" : "")
          << absl::StrFormat("eval at step %d: test loss %.4f, test accuracy %.2f%% (%d samples)\n",
                             r.step, r.loss, 100.0 * r.accuracy, r.samples);
    };
  }
  auto result = (*trainer)->Run(opts);
  if (!result.ok()) {
    err << (tty ? "\n" : "") << "error: " << result.status().message() << "\n";
    return kExitFailed;
  }
  if (json) {
    out << ResultJson(*spec, *result) << "\n";
  } else {
    out << ResultTable(*spec, *result);
  }
  return kExitOk;
}

void AddTrainLocalCommand(CommandSet& set) {
  auto args = std::make_shared<TrainLocalArgs>();
  CLI::App* cmd =
      set.Add("train-local",
              "Train a job in this process with plain backpropagation (the reference trainer)",
              [args](Invocation& run) {
                return run.Formatted(
                    args->output, [&](std::ostream& o) { return TrainLocal(*args, o, run.err()); });
              });
  cmd->add_option("job", args->job_path, "Job spec (YAML)")->required()->check(CLI::ExistingFile);
  AddOutputOption(cmd, args->output, "Result format");
  cmd->add_option("--threads", args->threads, "CPU threads for LibTorch (0 = all cores)")
      ->capture_default_str();
  cmd->add_option("--steps", args->steps, "Train this many steps instead of the spec's budget");
  cmd->add_option("--epochs", args->epochs, "Train this many epochs instead of the spec's budget");
  cmd->add_option("--log-every", args->log_every, "Steps between progress lines")
      ->capture_default_str();
  cmd->add_flag("!--no-resume", args->resume,
                "Start fresh even when checkpoint.dir holds a checkpoint");
  cmd->add_flag("-q,--quiet", args->quiet, "Print only the result");
  AddSetOption(cmd, args->sets);
}

}  // namespace stagewise::cli
