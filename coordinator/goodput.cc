#include "coordinator/goodput.h"

#include <algorithm>

namespace stagewise::coordinator {
namespace {

constexpr char kPrefix[] = "goodput.";

// The summary keys, in the order of v1::Goodput's fields.
struct Key {
  const char* name;
  double WorkerSecondsByUse::*field;
};
constexpr Key kKeys[] = {
    {"productive", &WorkerSecondsByUse::productive},
    {"bubble", &WorkerSecondsByUse::bubble},
    {"startup", &WorkerSecondsByUse::startup},
    {"checkpoint", &WorkerSecondsByUse::checkpoint},
    {"recovery", &WorkerSecondsByUse::recovery},
    {"queued", &WorkerSecondsByUse::queued},
};

double Seconds(absl::Time from, absl::Time to) {
  return std::max(0.0, absl::ToDoubleSeconds(to - from));
}

}  // namespace

WorkerSecondsByUse& WorkerSecondsByUse::operator+=(const WorkerSecondsByUse& other) {
  productive += other.productive;
  bubble += other.bubble;
  startup += other.startup;
  checkpoint += other.checkpoint;
  recovery += other.recovery;
  queued += other.queued;
  idle_waiting += other.idle_waiting;
  idle_unqueued += other.idle_unqueued;
  return *this;
}

void AttemptUse::Placed(int workers, absl::Time now) {
  *this = AttemptUse{};
  workers_ = workers;
  placed_ = now;
}

void AttemptUse::Running(absl::Time now) {
  if (placed() && running_ == absl::InfinitePast()) running_ = now;
}

void AttemptUse::Compute(int stage, double cumulative_seconds) {
  double& seen = compute_[stage];
  seen = std::max(seen, cumulative_seconds);
}

void AttemptUse::CheckpointWrite(int64_t step, int stage, double seconds) {
  (void)stage;
  if (seconds <= 0) return;
  double& slowest = checkpoint_max_[step];
  slowest = std::max(slowest, seconds);
  checkpoint_stage_seconds_ += seconds;
}

WorkerSecondsByUse AttemptUse::Close(absl::Time now, int replicas, double recovery_seconds,
                                     double redone_seconds) const {
  WorkerSecondsByUse use;
  if (!placed()) return use;
  const double w = workers_;
  const absl::Time running = running_ == absl::InfinitePast() ? now : running_;
  use.startup = w * Seconds(placed_, std::min(running, now));
  const double run = w * Seconds(running, now);
  if (run <= 0) return use;
  double checkpoint = 0;
  for (const auto& [step, seconds] : checkpoint_max_) checkpoint += seconds;
  use.checkpoint = std::min(run, w * checkpoint);
  double compute = 0;
  for (const auto& [stage, seconds] : compute_) compute += seconds;
  compute *= std::max(1, replicas);
  const double left = run - use.checkpoint;
  use.recovery = std::min(left, w * (recovery_seconds + redone_seconds));
  // The redone steps' compute is no longer productive.
  const double made =
      compute - checkpoint_stage_seconds_ * std::max(1, replicas) - w * redone_seconds;
  use.productive = std::clamp(made, 0.0, left - use.recovery);
  use.bubble = std::max(0.0, left - use.recovery - use.productive);
  return use;
}

void WriteUse(const WorkerSecondsByUse& use, google::protobuf::Map<std::string, double>* summary) {
  for (const Key& k : kKeys) (*summary)[std::string(kPrefix) + k.name] = use.*(k.field);
}

WorkerSecondsByUse ReadUse(const google::protobuf::Map<std::string, double>& summary) {
  WorkerSecondsByUse use;
  for (const Key& k : kKeys) {
    auto it = summary.find(std::string(kPrefix) + k.name);
    if (it != summary.end()) use.*(k.field) = it->second;
  }
  return use;
}

v1::Goodput ToProto(const WorkerSecondsByUse& use) {
  v1::Goodput g;
  g.set_productive_worker_seconds(use.productive);
  g.set_bubble_worker_seconds(use.bubble);
  g.set_startup_worker_seconds(use.startup);
  g.set_checkpoint_worker_seconds(use.checkpoint);
  g.set_recovery_worker_seconds(use.recovery);
  g.set_queued_worker_seconds(use.queued);
  g.set_idle_waiting_worker_seconds(use.idle_waiting);
  g.set_idle_unqueued_worker_seconds(use.idle_unqueued);
  const double held = use.Held();
  const double steps = use.productive + use.bubble;
  g.set_held_worker_seconds(held);
  g.set_goodput(held > 0 ? steps / held : 0);
  g.set_compute_share(steps > 0 ? use.productive / steps : 0);
  return g;
}

std::map<std::string, double> ByUse(const v1::Goodput& g) {
  return {{"productive", g.productive_worker_seconds()},
          {"bubble", g.bubble_worker_seconds()},
          {"startup", g.startup_worker_seconds()},
          {"checkpoint", g.checkpoint_worker_seconds()},
          {"recovery", g.recovery_worker_seconds()},
          {"idle_waiting", g.idle_waiting_worker_seconds()},
          {"idle_unqueued", g.idle_unqueued_worker_seconds()}};
}

void ClusterUse::Tick(absl::Time now, int registered, int held, bool queue_waiting) {
  if (since_ == absl::InfinitePast()) since_ = now;
  if (last_ != absl::InfinitePast()) {
    const double dt = Seconds(last_, now);
    registered_seconds_ += registered_ * dt;
    const double idle = std::max(0, registered_ - held_) * dt;
    (waiting_ ? idle_.idle_waiting : idle_.idle_unqueued) += idle;
  }
  last_ = std::max(last_, now);
  registered_ = registered;
  held_ = held;
  waiting_ = queue_waiting;
}

}  // namespace stagewise::coordinator
