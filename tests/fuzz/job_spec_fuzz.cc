// Fuzz target: a job spec as a client submits it (YAML text). Invariants: a
// spec that parses also validates, has a positive batch, one or more phases
// of bounded length, and stays valid when its length is overridden (what
// `stagewise local --steps` does); a refusal is an ordinary status, never an
// exception or a crash, and its message is bounded.
#include <cstdint>
#include <string>

#include "services/spec/job_spec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<stagewise::JobSpec> spec = stagewise::ParseJobSpec(text);
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().message().size() < 4096, "an error message echoes too much");
    return 0;
  }
  const absl::Status valid = stagewise::ValidateJobSpec(*spec);
  FUZZ_CHECK(valid.ok(), std::string(valid.message()).c_str());
  FUZZ_CHECK(spec->batch_size > 0, "batch_size");
  FUZZ_CHECK(spec->steps <= int64_t{1000000000000}, "steps");
  const std::vector<stagewise::PhaseSpec> phases = stagewise::Phases(*spec);
  FUZZ_CHECK(!phases.empty(), "no phase");
  absl::StatusOr<std::string> shorter = stagewise::OverrideSteps(text, 3);
  if (shorter.ok()) {
    absl::StatusOr<stagewise::JobSpec> again = stagewise::ParseJobSpec(*shorter);
    FUZZ_CHECK(again.ok(), std::string(again.status().message()).c_str());
  }
  return 0;
}
