// The --metrics-job-ids / --metrics-job-key-file flags of the coordinator
// and the worker (docs/security.md): how job ids appear on /metrics.
#ifndef STAGEWISE_SERVICES_METRICS_FLAGS_H_
#define STAGEWISE_SERVICES_METRICS_FLAGS_H_

#include <CLI/CLI.hpp>
#include <string>

namespace stagewise::metrics {

inline void AddJobLabelFlags(CLI::App* app, std::string* mode, std::string* key_file) {
  app->add_option("--metrics-job-ids", *mode,
                  "How /metrics series name jobs: plain (the job id), hashed (an HMAC of it under "
                  "--metrics-job-key-file: dashboards group by job without learning ids) or "
                  "omitted (no job ids; the coordinator exports no per-job series)")
      ->check(CLI::IsMember({"plain", "hashed", "omitted"}))
      ->envname("STAGEWISE_METRICS_JOB_IDS")
      ->capture_default_str();
  app->add_option("--metrics-job-key-file", *key_file,
                  "With --metrics-job-ids hashed: a file of at least 16 secret bytes, the same "
                  "on the coordinator and every worker")
      ->envname("STAGEWISE_METRICS_JOB_KEY_FILE");
}

}  // namespace stagewise::metrics

#endif  // STAGEWISE_SERVICES_METRICS_FLAGS_H_
