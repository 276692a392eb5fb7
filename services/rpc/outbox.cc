#include "services/rpc/outbox.h"

#include "services/common/check.h"
#include "services/common/log.h"

namespace stagewise::rpc {

absl::string_view OutboxStateName(OutboxState state) {
  switch (state) {
    case OutboxState::kOpen:
      return "OPEN";
    case OutboxState::kClosing:
      return "CLOSING";
    case OutboxState::kFinishing:
      return "FINISHING";
    case OutboxState::kDone:
      return "DONE";
  }
  return "UNKNOWN";
}

bool IsLegalOutboxTransition(OutboxState from, OutboxState to) {
  switch (to) {
    case OutboxState::kOpen:
      return false;
    case OutboxState::kClosing:
      return from == OutboxState::kOpen;
    case OutboxState::kFinishing:
      return from == OutboxState::kClosing;
    case OutboxState::kDone:
      // The transport may end the call before we finish it (cancellation).
      return from != OutboxState::kDone;
  }
  return false;
}

void ReportIllegalOutboxTransition(absl::string_view name, OutboxState from, OutboxState to) {
  STAGEWISE_BUG(IsLegalOutboxTransition(from, to))
      << name << ": illegal outbox transition " << OutboxStateName(from) << " -> "
      << OutboxStateName(to);
}

void ReportUnexpectedOutboxEvent(absl::string_view name, absl::string_view what) {
  STAGEWISE_LOG(ERROR) << name << ": unexpected outbox event: " << what;
}

}  // namespace stagewise::rpc
