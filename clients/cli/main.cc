// stagewise: the command-line client. Parses flags and dispatches; the
// commands live in the stagewise_cli library.
#include <CLI/CLI.hpp>
#include <iostream>

#include "clients/cli/commands.h"

int main(int argc, char** argv) {
  using namespace stagewise::cli;
  CLI::App app{
      "stagewise: train one neural network across many machines, with exact pipelined\n"
      "backpropagation or decoupled algorithms (PETRA, delayed gradients, features replay,\n"
      "N-wise interlocking backpropagation, auxiliary-variable networks).\n"
      "Job files are YAML; see docs/job_spec.md and examples/."};
  app.require_subcommand(1);
  app.set_version_flag("--version", VersionString());

  auto* version = app.add_subcommand("version", "Print the version and the libraries built in");

  TrainLocalArgs train;
  auto* train_cmd = app.add_subcommand(
      "train-local",
      "Train a job in this process with plain backpropagation (the reference trainer)");
  train_cmd->add_option("job", train.job_path, "Job spec (YAML)")
      ->required()
      ->check(CLI::ExistingFile);
  train_cmd->add_option("-o,--output", train.output, "Result format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
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

  ValidateArgs validate;
  auto* validate_cmd = app.add_subcommand(
      "validate", "Check a job spec and print its model's blocks and stage partition");
  validate_cmd->add_option("job", validate.job_path, "Job spec (YAML)")
      ->required()
      ->check(CLI::ExistingFile);
  validate_cmd->add_option("-o,--output", validate.output, "Output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

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
  if (train_cmd->parsed()) return TrainLocal(train, std::cout, std::cerr);
  if (validate_cmd->parsed()) return Validate(validate, std::cout, std::cerr);
  return kExitInvalid;
}
