// stagewise-worker's command line as an options struct: main.cc parses it
// here and runs it; tests build and parse it without starting a process.
#ifndef STAGEWISE_WORKER_FLAGS_H_
#define STAGEWISE_WORKER_FLAGS_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "services/common/parse_flags.h"
#include "worker/worker.h"

namespace stagewise::worker {

struct WorkerFlags {
  WorkerOptions worker;       // what the Worker gets (TLS applied, labels split)
  std::string port_file;      // "" = none
  std::string health_listen;  // "" = no plaintext health server
  std::string log_level = "info";
  int threads = 0;  // LibTorch CPU threads; 0 = LibTorch's default
  // How long a SIGTERM leaves a running stage to checkpoint and move.
  absl::Duration termination_grace = absl::Seconds(50);
  bool insecure = false;  // --insecure (logged as a warning)
};

// What parsing gave: the flags to run with, or the exit code of a process
// that must not run (0 after --help or --version, printed to `out`; 2 for a
// bad flag, named on `err`).
using ParsedWorkerFlags = ParsedFlags<WorkerFlags>;

// Parses `args` (without the program name). $STAGEWISE_COORDINATOR and the
// other variables the flags name are read here.
ParsedWorkerFlags ParseWorkerFlags(const std::vector<std::string>& args, std::ostream& out,
                                   std::ostream& err);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_FLAGS_H_
