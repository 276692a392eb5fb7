// The profiler: runs every block of a job's model at its batch size on this
// process's device and fills a ModelProfile (times are measured, not
// modelled, as in Jiang et al.'s reversible training framework, Sec. 4.2;
// docs/references.md). Results are cached per (model, batch size, device,
// threads) in a directory, so a plan or an `auto` partition costs one
// profiling run per machine.
#ifndef STAGEWISE_SERVICES_PROFILER_PROFILER_H_
#define STAGEWISE_SERVICES_PROFILER_PROFILER_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "services/planner/profile.h"
#include "services/spec/job_spec.h"

namespace stagewise::planner {

struct ProfileOptions {
  int warmup = 2;         // untimed rounds first
  int repeats = 5;        // timed rounds; each figure keeps its lower quartile
  std::string aux_head;   // nwise aux head to time on block outputs ("" = the job's, if nwise)
  std::string cache_dir;  // "" = no cache
  bool refresh = false;   // profile again even when cached
  // One line per block while profiling (progress on long runs).
  std::function<void(const std::string&)> progress;
};

// $STAGEWISE_PROFILE_CACHE, else $XDG_CACHE_HOME/stagewise/profiles, else
// $HOME/.cache/stagewise/profiles.
std::string DefaultProfileCacheDir();

// What a cached profile is filed under: the model's blocks (kinds, shapes,
// widths; an emulated model's waits), the batch size, the device and the
// thread count.
std::string ProfileKey(const JobSpec& spec, int64_t batch_size, const torch::Device& device,
                       int threads, const std::string& aux_head);

// Profiles now (no cache).
absl::StatusOr<ModelProfile> ProfileModel(const JobSpec& spec, int64_t batch_size,
                                          const torch::Device& device,
                                          const ProfileOptions& options);

// The cached profile when options.cache_dir holds one with the same key (and
// not options.refresh); otherwise profiles and writes the cache (a temporary
// file of this call's own, then rename: processes that profile the same key
// at once do not collide). A cache that cannot be written is reported
// through options.progress, not as an error. `cached` (optional) says which
// happened.
absl::StatusOr<ModelProfile> CachedProfile(const JobSpec& spec, int64_t batch_size,
                                           const torch::Device& device,
                                           const ProfileOptions& options, bool* cached = nullptr);

}  // namespace stagewise::planner

#endif  // STAGEWISE_SERVICES_PROFILER_PROFILER_H_
