// Text helpers of the spec library: the canonical spelling of numbers, the
// "did you mean" suggestions and the shape of every error message
// ("key.path: message"). Internal to services/spec/.
#ifndef STAGEWISE_SERVICES_SPEC_TEXT_H_
#define STAGEWISE_SERVICES_SPEC_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stagewise::spec {

// INVALID_ARGUMENT "path: message".
absl::Status KeyError(absl::string_view path, absl::string_view message);

// "parent.key", or "key" at the top level.
std::string JoinPath(absl::string_view parent, absl::string_view key);

// Shortest text that reads back as exactly `value`, so canonical parameter
// strings and error messages show "0.1" rather than "0.10000000000000001".
std::string FormatDouble(double value);

bool ParseIntText(absl::string_view text, int64_t* out);
// Non-finite values are rejected: no hyperparameter means anything as inf/nan.
bool ParseDoubleText(absl::string_view text, double* out);
// YAML 1.1 spellings too (yes/no/on/off), since yaml-cpp and users treat them
// as booleans.
bool ParseBoolText(absl::string_view text, bool* out);

// The closest candidate if it is close enough to be a plausible typo.
std::optional<std::string> Suggest(absl::string_view word,
                                   const std::vector<std::string>& candidates);

// A user's word quoted back in an error: long ones are cut (a message must
// stay readable and small whatever was submitted).
std::string Clip(absl::string_view word);

// "must be one of a, b, c; got 'x'", with a suggestion when one is close.
std::string ChoiceMessage(absl::string_view value, const std::vector<std::string>& choices);

bool Contains(const std::vector<std::string>& list, absl::string_view value);

// An error from parsing or checking phase `i`, with "phases[i]." in front.
absl::Status InPhase(size_t i, const absl::Status& status);

}  // namespace stagewise::spec

#endif  // STAGEWISE_SERVICES_SPEC_TEXT_H_
