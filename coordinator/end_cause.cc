#include "coordinator/end_cause.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace stagewise::coordinator {
namespace {

constexpr absl::string_view kPrefix = "END_CAUSE_";

}  // namespace

const v1::EndCausePolicy& PolicyOf(v1::EndCause cause) {
  const google::protobuf::EnumValueDescriptor* value =
      v1::EndCause_descriptor()->FindValueByNumber(cause);
  if (value == nullptr) value = v1::EndCause_descriptor()->FindValueByNumber(0);
  return value->options().GetExtension(v1::end_cause_policy);
}

std::string CauseLabel(v1::EndCause cause) {
  if (cause == v1::END_CAUSE_UNSPECIFIED) return "";
  absl::string_view name = v1::EndCause_Name(cause);
  if (absl::StartsWith(name, kPrefix)) name.remove_prefix(kPrefix.size());
  return absl::AsciiStrToLower(name);
}

v1::EndCause CauseOf(const v1::JobAttempt& attempt) {
  if (attempt.cause() != v1::END_CAUSE_UNSPECIFIED || attempt.end_cause().empty()) {
    return attempt.cause();
  }
  v1::EndCause cause = v1::END_CAUSE_UNSPECIFIED;
  if (!v1::EndCause_Parse(absl::StrCat(kPrefix, absl::AsciiStrToUpper(attempt.end_cause())),
                          &cause)) {
    return v1::END_CAUSE_UNSPECIFIED;
  }
  return cause;
}

void SetEndCause(v1::JobAttempt* attempt, v1::EndCause cause) {
  attempt->set_cause(cause);
  attempt->set_end_cause(CauseLabel(cause));
}

}  // namespace stagewise::coordinator
