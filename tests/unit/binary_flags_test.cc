// The binaries' command lines as options structs: the CLI's CommandSet (every
// command added by its own file), stagewise-worker's WorkerFlags and
// stagewise-coordinator's CoordinatorFlags, parsed without a process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "coordinator/flags.h"
#include "worker/flags.h"

namespace stagewise {
namespace {

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

CliRun RunCli(const std::vector<std::string>& args) {
  CLI::App app{"test", "stagewise"};
  app.require_subcommand(1);
  app.fallthrough();
  cli::GlobalFlags globals;
  cli::AddGlobalFlags(app, globals);
  cli::CommandSet commands(app, globals);
  cli::AddAllCommands(commands);
  std::ostringstream out, err;
  CliRun run;
  run.code = commands.Run(args, out, err);
  run.out = out.str();
  run.err = err.str();
  return run;
}

TEST(CommandSet, EveryTopLevelCommandRunsSomethingOrHasSubcommands) {
  CLI::App app{"test", "stagewise"};
  cli::GlobalFlags globals;
  cli::CommandSet commands(app, globals);
  cli::AddAllCommands(commands);
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  for (const char* expected :
       {"version", "train-local", "validate",     "submit",      "status", "list",
        "watch",   "cancel",      "workers",      "checkpoints", "events", "export",
        "plot",    "trace",       "doctor",       "local",       "plan",   "config",
        "admin",   "completion",  "metrics-label"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
}

TEST(CommandSet, RunsTheParsedCommandWithItsOwnFlags) {
  const CliRun version = RunCli({"version"});
  EXPECT_EQ(version.code, cli::kExitOk);
  EXPECT_TRUE(absl::StartsWith(version.out, "stagewise ")) << version.out;

  const CliRun labels = RunCli({"metrics-label", "job-0000002a", "--key-file", "/nonexistent/k"});
  EXPECT_EQ(labels.code, cli::kExitInvalid);
  EXPECT_TRUE(absl::StrContains(labels.err, "/nonexistent/k")) << labels.err;
}

TEST(CommandSet, UnknownCommandsAtEveryDepthAreErrorsWithASuggestion) {
  const CliRun top = RunCli({"stauts", "job-1"});
  EXPECT_EQ(top.code, cli::kExitInvalid);
  EXPECT_TRUE(absl::StrContains(top.err, "did you mean 'status'")) << top.err;
  const CliRun nested = RunCli({"config", "use-contex", "x"});
  EXPECT_EQ(nested.code, cli::kExitInvalid);
  EXPECT_TRUE(absl::StrContains(nested.err, "did you mean 'config use-context'")) << nested.err;
  const CliRun help = RunCli({"admin", "nosuch", "--help"});
  EXPECT_EQ(help.code, cli::kExitInvalid);
}

TEST(CommandSet, MissingArgumentsAndDeprecatedSpellingsAreReported) {
  const CliRun missing = RunCli({"status"});
  EXPECT_EQ(missing.code, cli::kExitInvalid);
  EXPECT_TRUE(absl::StrContains(missing.err, "job_id")) << missing.err;
  const CliRun plot = RunCli({"plot", "a.tsv"});
  EXPECT_EQ(plot.code, cli::kExitInvalid);
  EXPECT_TRUE(absl::StrContains(plot.err, "--output-file is required")) << plot.err;
  const CliRun both = RunCli({"plot", "a.tsv", "-o", "x.svg", "--output-file", "y.svg"});
  EXPECT_EQ(both.code, cli::kExitInvalid);
  EXPECT_TRUE(absl::StrContains(both.err, "deprecated")) << both.err;
  EXPECT_TRUE(absl::StrContains(both.err, "both")) << both.err;
  const CliRun help = RunCli({"list", "--help"});
  EXPECT_EQ(help.code, cli::kExitOk);
  EXPECT_TRUE(absl::StrContains(help.out, "--limit")) << help.out;
}

TEST(WorkerFlags, ParseIntoTheWorkersOptions) {
  std::ostringstream out, err;
  const worker::ParsedWorkerFlags parsed = worker::ParseWorkerFlags(
      {"--coordinator", "10.0.0.1:7070", "--listen", "127.0.0.1:0", "--label", "gpu=a100",
       "--label", "zone=b", "--collective-timeout", "42", "--termination-grace", "7", "--threads",
       "3", "--data-root", "/data:/more"},
      out, err);
  ASSERT_TRUE(parsed.run) << err.str();
  const worker::WorkerFlags& f = parsed.flags;
  EXPECT_EQ(f.worker.coordinator, "10.0.0.1:7070");
  EXPECT_EQ(f.worker.labels.at("gpu"), "a100");
  EXPECT_EQ(f.worker.labels.at("zone"), "b");
  EXPECT_EQ(f.worker.collective_timeout, absl::Seconds(42));
  EXPECT_EQ(f.termination_grace, absl::Seconds(7));
  EXPECT_EQ(f.threads, 3);
  EXPECT_EQ(f.worker.data_roots.roots, (std::vector<std::string>{"/data", "/more"}));
  EXPECT_FALSE(f.worker.require_worker_identity);  // no TLS flags
}

TEST(WorkerFlags, BadValuesNameTheFlagAndExitTwo) {
  std::ostringstream out, err;
  worker::ParsedWorkerFlags parsed =
      worker::ParseWorkerFlags({"--listen", "127.0.0.1:0", "--label", "state=idle"}, out, err);
  EXPECT_FALSE(parsed.run);
  EXPECT_EQ(parsed.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(err.str(), "coordinator's")) << err.str();

  std::ostringstream out2, err2;
  parsed = worker::ParseWorkerFlags({"--listen", "0.0.0.0:0"}, out2, err2);  // no TLS
  EXPECT_FALSE(parsed.run);
  EXPECT_EQ(parsed.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(err2.str(), "--listen")) << err2.str();

  std::ostringstream out3, err3;
  parsed = worker::ParseWorkerFlags({"--version"}, out3, err3);
  EXPECT_FALSE(parsed.run);
  EXPECT_EQ(parsed.exit_code, 0);
  EXPECT_TRUE(absl::StartsWith(out3.str(), "stagewise-worker ")) << out3.str();
}

TEST(CoordinatorFlags, ParseIntoTheManagersOptions) {
  std::ostringstream out, err;
  const coordinator::ParsedCoordinatorFlags parsed = coordinator::ParseCoordinatorFlags(
      {"--listen", "127.0.0.1:0", "--heartbeat-timeout", "3", "--recovery-settle", "0.5",
       "--max-jobs-per-owner", "9", "--tokens-reload-seconds", "0", "--web-listen", "127.0.0.1:0",
       "--web-header-timeout-seconds", "4", "--checkpoint-root", "/ck"},
      out, err);
  ASSERT_TRUE(parsed.run) << err.str();
  const coordinator::CoordinatorFlags& f = parsed.flags;
  EXPECT_EQ(f.manager.heartbeat_timeout, absl::Seconds(3));
  EXPECT_EQ(f.manager.recovery_settle, absl::Milliseconds(500));
  EXPECT_EQ(f.manager.max_live_jobs_per_owner, 9);
  EXPECT_EQ(f.manager.checkpoint_roots.roots, std::vector<std::string>{"/ck"});
  EXPECT_EQ(f.tokens_reload, absl::ZeroDuration());
  EXPECT_EQ(f.web.listen, "127.0.0.1:0");
  EXPECT_EQ(f.web.limits.header_timeout, absl::Seconds(4));
  EXPECT_EQ(f.db, "stagewise.db");  // the default
}

TEST(CoordinatorFlags, BadValuesNameTheFlagAndExitTwo) {
  std::ostringstream out, err;
  coordinator::ParsedCoordinatorFlags parsed = coordinator::ParseCoordinatorFlags(
      {"--listen", "127.0.0.1:0", "--configure-timeout", "0"}, out, err);
  EXPECT_FALSE(parsed.run);
  EXPECT_EQ(parsed.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(err.str(), "--configure-timeout")) << err.str();

  std::ostringstream out2, err2;
  parsed = coordinator::ParseCoordinatorFlags(
      {"--listen", "127.0.0.1:0", "--metrics-job-ids", "hashed"}, out2, err2);
  EXPECT_FALSE(parsed.run);
  EXPECT_EQ(parsed.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(err2.str(), "key")) << err2.str();
}

}  // namespace
}  // namespace stagewise
