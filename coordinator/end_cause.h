// Why an attempt ended (v1::EndCause) and what follows from it: the policy
// each cause carries in coordinator.proto (planned or not, counted against
// recovery.max_restarts or not) and its label (the restart metric's cause,
// JobAttempt.end_cause). Causes are compared as enums only.
#ifndef STAGEWISE_COORDINATOR_END_CAUSE_H_
#define STAGEWISE_COORDINATOR_END_CAUSE_H_

#include <string>

#include "stagewise/v1/coordinator.pb.h"

namespace stagewise::coordinator {

// The policy on the cause's enum value.
const v1::EndCausePolicy& PolicyOf(v1::EndCause cause);
// "worker_lost" for END_CAUSE_WORKER_LOST; "" for END_CAUSE_UNSPECIFIED.
std::string CauseLabel(v1::EndCause cause);
// An attempt's cause: `cause`, or for a record stored before that field,
// the one its `end_cause` label names (UNSPECIFIED when none does).
v1::EndCause CauseOf(const v1::JobAttempt& attempt);
// Writes the cause and its label.
void SetEndCause(v1::JobAttempt* attempt, v1::EndCause cause);

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_END_CAUSE_H_
