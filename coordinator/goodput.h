// Goodput (docs/operations.md, "Goodput"): where the pool's worker-seconds
// went, for each job and for the cluster, from what the coordinator already
// sees (placements, state changes, the stages' cumulative compute seconds,
// their checkpoint write times, the replacements and the steps redone).
//
// A job's attempt holds W workers from its placement to its end:
//   startup     W x (placement .. RUNNING): profiling, model build, resume;
//   checkpoint  W x the slowest stage's write time, per checkpointed step
//               (the pipeline waits for it);
//   recovery    W x the time a replaced stage took to bring the job back to
//               full speed (recovery.replay), and W x the steps this attempt
//               ran past the checkpoint the next one resumes from (redone);
//   productive  what the stages computed (forward, backward, optimizer,
//               evaluation: their compute seconds, x replicas), less the
//               checkpoint writes and the redone steps;
//   bubble      the rest of the running time: stages waiting for their
//               neighbours (pipeline bubbles, transfer, imbalance).
// `queued` is demand, not use: the workers a waiting job asked for x the time
// it waited. The cluster adds idle worker-seconds, split into those while a
// job waited (the scheduler's loss) and those with nothing to place.
//
// Threading: plain data and functions; the JobManager's loop thread.
#ifndef STAGEWISE_COORDINATOR_GOODPUT_H_
#define STAGEWISE_COORDINATOR_GOODPUT_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

// Worker-seconds by use (v1::Goodput's fields).
struct WorkerSecondsByUse {
  double productive = 0;
  double bubble = 0;
  double startup = 0;
  double checkpoint = 0;
  double recovery = 0;
  double queued = 0;         // demand while waiting (not held)
  double idle_waiting = 0;   // cluster: idle while some job waited
  double idle_unqueued = 0;  // cluster: idle with nothing to place
  double Held() const { return productive + bubble + startup + checkpoint + recovery; }
  WorkerSecondsByUse& operator+=(const WorkerSecondsByUse& other);
};

// One attempt's accounting, from its placement to its end.
class AttemptUse {
 public:
  bool placed() const { return placed_ != absl::InfinitePast(); }
  void Placed(int workers, absl::Time now);
  void Running(absl::Time now);
  // A stage of replica 0 reported its cumulative compute seconds.
  void Compute(int stage, double cumulative_seconds);
  // A stage wrote its shard of `step` in `seconds`.
  void CheckpointWrite(int64_t step, int stage, double seconds);
  // The attempt ends at `now`: `replicas` per stage, `recovery_seconds` of
  // replacements (wall time, the whole job), `redone_seconds` of steps run
  // past the checkpoint the next attempt resumes from (wall time).
  WorkerSecondsByUse Close(absl::Time now, int replicas, double recovery_seconds,
                           double redone_seconds) const;

 private:
  int workers_ = 0;
  absl::Time placed_ = absl::InfinitePast();
  absl::Time running_ = absl::InfinitePast();
  std::map<int, double> compute_;             // stage -> cumulative seconds
  std::map<int64_t, double> checkpoint_max_;  // step -> slowest stage's write
  double checkpoint_stage_seconds_ = 0;       // every stage's writes summed
};

// The job's totals as JobStatus.summary entries ("goodput.productive", ...,
// worker-seconds), and back.
void WriteUse(const WorkerSecondsByUse& use, google::protobuf::Map<std::string, double>* summary);
WorkerSecondsByUse ReadUse(const google::protobuf::Map<std::string, double>& summary);
// As the wire message (goodput: the share of held time in training steps,
// productive + bubble; compute_share: productive over that).
v1::Goodput ToProto(const WorkerSecondsByUse& use);
// The message's worker-seconds held or idle, by use ("productive", ...,
// "idle_unqueued"): the metric's labels.
std::map<std::string, double> ByUse(const v1::Goodput& g);

// The cluster's integral: registered and held workers and whether anything
// waits, constant between ticks.
class ClusterUse {
 public:
  // The state from `now` on; what held before is integrated up to `now`.
  void Tick(absl::Time now, int registered, int held, bool queue_waiting);
  // Worker-seconds of ended attempts (by use) and of running ones so far.
  void AddEnded(const WorkerSecondsByUse& use) { ended_ += use; }
  // Idle worker-seconds (both kinds) and registered worker-seconds.
  WorkerSecondsByUse Idle() const { return idle_; }
  double RegisteredSeconds() const { return registered_seconds_; }
  const WorkerSecondsByUse& Ended() const { return ended_; }
  absl::Time since() const { return since_; }

 private:
  absl::Time since_ = absl::InfinitePast();  // the first tick
  absl::Time last_ = absl::InfinitePast();
  int registered_ = 0;
  int held_ = 0;
  bool waiting_ = false;
  double registered_seconds_ = 0;
  WorkerSecondsByUse idle_;
  WorkerSecondsByUse ended_;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_GOODPUT_H_
