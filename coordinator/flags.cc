#include "coordinator/flags.h"

#include <CLI/CLI.hpp>
#include <ostream>

#include "services/common/log_flags.h"
#include "services/common/parse_flags.h"
#include "services/common/version.h"
#include "services/metrics/flags.h"
#include "services/spec/sharing.h"

namespace stagewise::coordinator {
namespace {

// The flags as CLI11 fills them, before they become CoordinatorFlags.
struct RawFlags {
  CoordinatorFlags parsed;
  std::string metrics_job_ids = "plain";
  std::string metrics_job_key_file;
  double heartbeat_timeout_s = 10;
  double configure_timeout_s = 120;
  double recovery_settle_s = 1;
  double metrics_ttl_s = 300;
  double tokens_reload_s = 10;
  double web_header_timeout_s = 0;
  int max_jobs_per_owner = 100;
  std::vector<std::string> checkpoint_roots;
  std::string scheduling_config;
};

// Where it serves and keeps its state.
void AddServingFlags(CLI::App& app, RawFlags& raw) {
  CoordinatorFlags& f = raw.parsed;
  app.add_option("--listen", f.listen, "gRPC address (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--metrics-listen", f.metrics_listen, "Prometheus /metrics address (empty: off)")
      ->capture_default_str();
  metrics::AddJobLabelFlags(&app, &raw.metrics_job_ids, &raw.metrics_job_key_file);
  app.add_option("--db", f.db, "SQLite database file")->capture_default_str();
  app.add_option("--port-file", f.port_file,
                 "Write 'GRPC_PORT METRICS_PORT' here once serving (for supervisors)");
  app.add_option("--health-listen", f.health_listen,
                 "Plaintext grpc.health.v1 address for probes that speak no TLS, e.g. "
                 "0.0.0.0:8081 (empty: off; the health service is always on --listen too)");
  app.add_option("--web-listen", f.web.listen,
                 "Address of the status pages (jobs, workers, a page per job), e.g. "
                 "127.0.0.1:8080: HTTPS with --tls-cert when TLS is on, a read token with "
                 "--tokens (empty: off; env STAGEWISE_WEB_LISTEN)")
      ->envname("STAGEWISE_WEB_LISTEN");
  app.add_option("--web-refresh-seconds", f.web.refresh_seconds,
                 "How often the status pages reload themselves (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--web-header-timeout-seconds", raw.web_header_timeout_s,
                 "Time a status-page request has for its TLS handshake, request line and "
                 "headers before its connection is closed (slow clients)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

// How jobs and workers are looked after.
void AddJobFlags(CLI::App& app, RawFlags& raw) {
  app.add_option("--heartbeat-timeout", raw.heartbeat_timeout_s,
                 "Seconds without a heartbeat before a worker is declared lost")
      ->capture_default_str();
  app.add_option("--configure-timeout", raw.configure_timeout_s,
                 "Seconds the stages of a placed job have to acknowledge their assignment "
                 "before the attempt is given up (and recovered)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--recovery-settle", raw.recovery_settle_s,
                 "Seconds a recovering job waits before it is placed again, so that every "
                 "worker lost in one fault is known (and none of them is chosen)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--finished-job-metrics-ttl", raw.metrics_ttl_s,
                 "Seconds a finished job's stagewise_job_* series stay on /metrics (so a "
                 "scraper sees the final values) before they are removed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-jobs-per-owner", raw.max_jobs_per_owner,
                 "Jobs one token may have that have not ended")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--scheduling-config", raw.scheduling_config,
                 "A YAML file of priority classes (jobs name one with `priority:`; a waiting "
                 "job of a higher class takes workers from lower ones through a planned "
                 "checkpoint stop), per-owner quotas and fair-share weights "
                 "(docs/operations.md, \"Sharing the cluster\"). Without it: first come, "
                 "first served with backfill (env STAGEWISE_SCHEDULING_CONFIG)")
      ->envname("STAGEWISE_SCHEDULING_CONFIG");
  app.add_option("--checkpoint-root", raw.checkpoint_roots,
                 "A directory a job's checkpoint.dir may name (or lie under); repeatable. "
                 "Without one, jobs with checkpoint.dir are refused "
                 "(env STAGEWISE_CHECKPOINT_ROOT, ':'-separated)")
      ->envname("STAGEWISE_CHECKPOINT_ROOT")
      ->delimiter(':');
}

// Who may call, and how they prove it.
void AddAccessFlags(CLI::App& app, RawFlags& raw) {
  app.add_option("--tokens", raw.parsed.tokens_file,
                 "Bearer tokens of clients, one '<secret> <role> <name>' per line (roles: "
                 "read, submit, admin); without it every client is an admin "
                 "(env STAGEWISE_TOKENS_FILE)")
      ->envname("STAGEWISE_TOKENS_FILE");
  app.add_option("--tokens-reload-seconds", raw.tokens_reload_s,
                 "How often the --tokens file is read again (rotated tokens apply to the next "
                 "calls; a file that does not parse keeps the tokens in force). 0: only on "
                 "SIGHUP, which always reloads at once")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  rpc::AddTlsFlags(&app, &raw.parsed.tls);
}

// The parsed values into CoordinatorFlags: 0 on success, else the exit code.
int Finish(RawFlags& raw, std::ostream& err) {
  CoordinatorFlags& f = raw.parsed;
  auto labels = metrics::MakeJobLabels(raw.metrics_job_ids, raw.metrics_job_key_file);
  if (!labels.ok()) {
    err << "stagewise-coordinator: " << labels.status().message() << "\n";
    return 2;
  }
  f.job_labels = *std::move(labels);
  f.manager.heartbeat_timeout = absl::Seconds(raw.heartbeat_timeout_s);
  f.manager.configure_timeout = absl::Seconds(raw.configure_timeout_s);
  f.manager.recovery_settle = absl::Seconds(raw.recovery_settle_s);
  f.manager.finished_job_metrics_ttl = absl::Seconds(raw.metrics_ttl_s);
  f.manager.max_live_jobs_per_owner = raw.max_jobs_per_owner;
  f.manager.checkpoint_roots = {true, raw.checkpoint_roots, "--checkpoint-root"};
  if (!raw.scheduling_config.empty()) {
    absl::StatusOr<SharingConfig> sharing = LoadSharingConfig(raw.scheduling_config);
    if (!sharing.ok()) {
      err << "stagewise-coordinator: --scheduling-config " << sharing.status().message() << "\n";
      return 2;
    }
    f.manager.sharing = *std::move(sharing);
  }
  f.tokens_reload = absl::Seconds(raw.tokens_reload_s);
  f.web.limits.header_timeout = absl::Seconds(raw.web_header_timeout_s);
  // Credentials first: a misconfigured coordinator fails before touching state.
  if (absl::Status s = rpc::CheckListenPolicy(f.listen, f.tls); !s.ok()) {
    err << "stagewise-coordinator: --listen: " << s.message() << "\n";
    return 2;
  }
  if (absl::Status s = rpc::ApplyTls(f.tls, &f.rpc); !s.ok()) {
    err << "stagewise-coordinator: " << s.message() << "\n";
    return 2;
  }
  f.web.tls = f.tls;
  return 0;
}

}  // namespace

ParsedCoordinatorFlags ParseCoordinatorFlags(const std::vector<std::string>& args,
                                             std::ostream& out, std::ostream& err) {
  RawFlags raw;
  raw.web_header_timeout_s = absl::ToDoubleSeconds(raw.parsed.web.limits.header_timeout);
  CLI::App app{
      "stagewise-coordinator: accepts jobs, assigns stages to workers, tracks progress.\n"
      "State lives in an SQLite file and survives restarts.",
      "stagewise-coordinator"};
  app.set_version_flag("--version", std::string("stagewise-coordinator ") + Version());
  AddServingFlags(app, raw);
  AddJobFlags(app, raw);
  AddAccessFlags(app, raw);
  log::AddLogLevelFlag(&app, &raw.parsed.log_level);
  return ParseBinaryFlags<CoordinatorFlags>(
      app, args, out, err, [&] { return Finish(raw, err); }, [&] { return std::move(raw.parsed); });
}

}  // namespace stagewise::coordinator
