// Early-return helpers for absl::Status / absl::StatusOr, shared by every
// module (absl has none in its public API).
//
//   STAGEWISE_RETURN_IF_ERROR(DoThing());           // returns the error status
//   STAGEWISE_ASSIGN_OR_RETURN(auto x, MakeThing()); // x = *MakeThing() or return
#ifndef STAGEWISE_SERVICES_COMMON_STATUS_MACROS_H_
#define STAGEWISE_SERVICES_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STAGEWISE_RETURN_IF_ERROR(expr)                    \
  do {                                                     \
    const absl::Status stagewise_status_ = (expr);         \
    if (!stagewise_status_.ok()) return stagewise_status_; \
  } while (0)

#define STAGEWISE_STATUS_CONCAT_INNER_(a, b) a##b
#define STAGEWISE_STATUS_CONCAT_(a, b) STAGEWISE_STATUS_CONCAT_INNER_(a, b)

// `lhs` may declare a variable (`auto x`) or name an existing one (`x`).
#define STAGEWISE_ASSIGN_OR_RETURN(lhs, expr)                                                    \
  STAGEWISE_ASSIGN_OR_RETURN_IMPL_(STAGEWISE_STATUS_CONCAT_(stagewise_statusor_, __LINE__), lhs, \
                                   expr)

#define STAGEWISE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = std::move(statusor).value()

#endif  // STAGEWISE_SERVICES_COMMON_STATUS_MACROS_H_
