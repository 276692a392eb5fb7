#include "worker/device_turns.h"

#include "absl/strings/str_cat.h"

namespace stagewise::worker {

// Each position of the order belongs to one chunk, and a chunk runs its
// positions in order. Position 0 (the first forward) belongs to the chunk
// that starts every step: when it asks, the position due is 0 only once the
// order of the step before is complete (or none ran yet), so it matches by
// its number alone, whatever the step's number (a new phase counts its
// steps from 0 again). A later position must be of the step position 0
// opened.
bool DeviceTurns::Due(int64_t step, int pos) const {
  if (!cancelled_.ok()) return true;
  if (pos_ != pos) return false;
  return pos == 0 || step == step_;
}

absl::Status DeviceTurns::Acquire(int64_t step, int pos, int size) {
  if (pos < 0 || pos >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("device turn ", pos, " outside the worker's order of ", size, " operations"));
  }
  absl::MutexLock lock(&mu_);
  auto due = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return Due(step, pos); };
  mu_.Await(absl::Condition(&due));
  if (!cancelled_.ok()) return cancelled_;
  if (pos == 0) step_ = step;
  return absl::OkStatus();
}

absl::Status DeviceTurns::Release(int64_t step, int pos, int size) {
  absl::MutexLock lock(&mu_);
  if (!cancelled_.ok()) return cancelled_;
  if (pos_ != pos || step_ != step) {
    return absl::FailedPreconditionError(absl::StrCat("device turn ", pos, " of step ", step,
                                                      " released while turn ", pos_, " of step ",
                                                      step_, " is due"));
  }
  pos_ = pos + 1 == size ? 0 : pos + 1;
  return absl::OkStatus();
}

void DeviceTurns::Cancel(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (cancelled_.ok()) cancelled_ = why.ok() ? absl::CancelledError("device turns cancelled") : why;
}

int DeviceTurns::position() const {
  absl::MutexLock lock(&mu_);
  return pos_;
}

int64_t DeviceTurns::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

}  // namespace stagewise::worker
