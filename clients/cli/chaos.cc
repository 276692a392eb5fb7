#include "clients/cli/chaos.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace stagewise::cli {
namespace {

// recovery.replay: the stages replaced inside attempts that are back at
// full speed.
int Repaired(const v1::JobStatus& s) {
  int n = 0;
  for (const v1::JobAttempt& a : s.attempts()) {
    for (const v1::StageReplacement& r : a.replacements()) n += r.full_speed_seconds() > 0 ? 1 : 0;
  }
  return n;
}

}  // namespace

ChaosSchedule::ChaosSchedule(int worker_kills, int coordinator_kills, int num_workers,
                             uint64_t seed)
    : rng_(seed), num_workers_(std::max(1, num_workers)) {
  targets_.assign(static_cast<size_t>(std::max(0, worker_kills)), Target::kWorker);
  targets_.insert(targets_.end(), static_cast<size_t>(std::max(0, coordinator_kills)),
                  Target::kCoordinator);
  std::shuffle(targets_.begin(), targets_.end(), rng_);
  std::uniform_real_distribution<double> fraction(0.05, 0.95);
  for (size_t i = 0; i < targets_.size(); ++i) fractions_.push_back(fraction(rng_));
  std::sort(fractions_.begin(), fractions_.end());
}

std::optional<ChaosSchedule::Kill> ChaosSchedule::Next(const v1::JobStatus& s) {
  if (next_ >= targets_.size()) return std::nullopt;
  if (s.state() != v1::RUNNING && s.state() != v1::CHECKPOINTING) return std::nullopt;
  if (next_ > 0) {
    if (s.step() <= last_step_) return std::nullopt;
    // After a worker kill: a later attempt, or (recovery.replay) its stage
    // replaced and back at full speed.
    if (last_target_ == Target::kWorker && s.attempt() <= last_attempt_ &&
        Repaired(s) <= last_repaired_) {
      return std::nullopt;
    }
  }
  // With the job's length unknown, any progress will do.
  const int64_t at = s.total_steps() > 0
                         ? std::max<int64_t>(1, std::llround(fractions_[next_] *
                                                             static_cast<double>(s.total_steps())))
                         : 1;
  if (s.step() < at) return std::nullopt;
  Kill kill;
  kill.target = targets_[next_];
  if (kill.target == Target::kWorker) {
    kill.worker = std::uniform_int_distribution<int>(0, num_workers_ - 1)(rng_);
  }
  last_step_ = s.step();
  last_attempt_ = s.attempt();
  last_repaired_ = Repaired(s);
  last_target_ = kill.target;
  ++next_;
  return kill;
}

int ChaosSchedule::made(Target target) const {
  return static_cast<int>(
      std::count(targets_.begin(), targets_.begin() + static_cast<std::ptrdiff_t>(next_), target));
}

std::string ChaosSchedule::Summary() const {
  const auto planned = [this](Target t) {
    return static_cast<int>(std::count(targets_.begin(), targets_.end(), t));
  };
  std::string text;
  for (Target t : {Target::kWorker, Target::kCoordinator}) {
    if (planned(t) == 0) continue;
    absl::StrAppend(&text, text.empty() ? "" : " and ", made(t), " of ", planned(t),
                    t == Target::kWorker ? " worker" : " coordinator", " kill(s)");
  }
  return text;
}

}  // namespace stagewise::cli
