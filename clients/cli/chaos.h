// `stagewise local --chaos`: when to kill which child process. Bookkeeping
// only: LocalRun feeds it the job's status from the watch and carries out the
// kills (kill -9, restart with the same flags).
#ifndef STAGEWISE_CLIENTS_CLI_CHAOS_H_
#define STAGEWISE_CLIENTS_CLI_CHAOS_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::cli {

class ChaosSchedule {
 public:
  enum class Target { kWorker, kCoordinator };
  struct Kill {
    Target target = Target::kWorker;
    int worker = 0;  // which one, for kWorker
  };

  // `worker_kills` of a random one of `num_workers` workers and
  // `coordinator_kills` of the coordinator, in a random order, at random
  // steps; all of it drawn from `seed`.
  ChaosSchedule(int worker_kills, int coordinator_kills, int num_workers, uint64_t seed);

  // The kill to make now, given the job's latest status, and then counted as
  // made. One is due once the job is RUNNING (or CHECKPOINTING) at or past
  // the next kill's step (a random fraction, 5% to 95%, of the job's steps;
  // the fractions increase from kill to kill) and has made progress since
  // the previous kill: its step is beyond the step of that kill and, after a
  // worker kill, a later attempt runs (the job recovered). So the job cannot
  // starve: every kill comes after steps that the previous one did not undo.
  std::optional<Kill> Next(const v1::JobStatus& status);

  int planned() const { return static_cast<int>(targets_.size()); }
  int made() const { return static_cast<int>(next_); }
  int made(Target target) const;
  // "2 of 3 worker kill(s) and 1 of 1 coordinator kill(s)"
  std::string Summary() const;

 private:
  std::mt19937_64 rng_;
  int num_workers_;
  std::vector<Target> targets_;    // in kill order
  std::vector<double> fractions_;  // of total steps, increasing
  size_t next_ = 0;
  // The previous kill: the step and attempt it interrupted, and its target.
  int64_t last_step_ = -1;
  int32_t last_attempt_ = -1;
  int last_repaired_ = 0;
  Target last_target_ = Target::kWorker;
};

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_CHAOS_H_
