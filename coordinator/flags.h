// stagewise-coordinator's command line as an options struct: main.cc parses
// it here and runs it; tests build and parse it without starting a process.
#ifndef STAGEWISE_COORDINATOR_FLAGS_H_
#define STAGEWISE_COORDINATOR_FLAGS_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/job_manager.h"
#include "coordinator/web_server.h"
#include "services/common/parse_flags.h"
#include "services/metrics/metrics.h"
#include "services/rpc/server.h"
#include "services/rpc/tls.h"

namespace stagewise::coordinator {

struct CoordinatorFlags {
  std::string listen = "0.0.0.0:7070";
  std::string metrics_listen = "0.0.0.0:9090";
  std::string db = "stagewise.db";
  std::string port_file;      // "" = none
  std::string health_listen;  // "" = no plaintext health server
  std::string log_level = "info";
  std::string tokens_file;  // "" = every client is an admin
  absl::Duration tokens_reload = absl::Seconds(10);
  rpc::TlsConfig tls;
  rpc::RpcOptions rpc;  // the server's credentials, from `tls`
  metrics::JobLabels job_labels;
  JobManagerOptions manager;
  // The status pages (off when web.listen is empty); the server fills in
  // their TLS, tokens and metrics.
  WebOptions web;
};

// What parsing gave: the flags to run with, or the exit code of a process
// that must not run (0 after --help or --version, printed to `out`; 2 for a
// bad flag, named on `err`).
using ParsedCoordinatorFlags = ParsedFlags<CoordinatorFlags>;

// Parses `args` (without the program name); the variables the flags name
// are read here.
ParsedCoordinatorFlags ParseCoordinatorFlags(const std::vector<std::string>& args,
                                             std::ostream& out, std::ostream& err);

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_FLAGS_H_
