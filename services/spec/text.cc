#include "services/spec/text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/utf8.h"
#include "services/spec/job_spec.h"

namespace stagewise::spec {
namespace {

// Words longer than this are not typos of a key or a name: no suggestion (and
// no quadratic work on hostile input).
constexpr size_t kMaxSuggestLength = 64;

// Optimal string alignment distance: Levenshtein plus adjacent transpositions,
// so "nmae" is one edit from "name". Three rows of memory.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        cur[j] = std::min(cur[j], before[j - 2] + 1);
      }
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

absl::Status KeyError(absl::string_view path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

std::string JoinPath(absl::string_view parent, absl::string_view key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
}

std::string FormatDouble(double value) {
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

bool ParseIntText(absl::string_view text, int64_t* out) { return absl::SimpleAtoi(text, out); }

bool ParseDoubleText(absl::string_view text, double* out) {
  return absl::SimpleAtod(text, out) && std::isfinite(*out);
}

bool ParseBoolText(absl::string_view text, bool* out) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "yes" || lower == "on") {
    *out = true;
    return true;
  }
  if (lower == "false" || lower == "no" || lower == "off") {
    *out = false;
    return true;
  }
  return false;
}

std::optional<std::string> Suggest(absl::string_view word,
                                   const std::vector<std::string>& candidates) {
  if (word.size() > kMaxSuggestLength) return std::nullopt;
  const size_t limit = std::clamp<size_t>(word.size() / 2, 1, 2);
  std::optional<std::string> best;
  size_t best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

std::string Clip(absl::string_view word) {
  if (word.size() <= kMaxSuggestLength) return std::string(word);
  return absl::StrCat(Utf8Prefix(word, kMaxSuggestLength), "... (", word.size(), " bytes)");
}

std::string ChoiceMessage(absl::string_view value, const std::vector<std::string>& choices) {
  std::string message =
      absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), "; got '", Clip(value), "'");
  if (auto suggestion = Suggest(value, choices)) {
    absl::StrAppend(&message, " (did you mean ", *suggestion, "?)");
  }
  return message;
}

bool Contains(const std::vector<std::string>& list, absl::string_view value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

absl::Status InPhase(size_t i, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("phases[", i, "].", status.message()));
}

}  // namespace stagewise::spec

namespace stagewise {

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  const std::string t(absl::StripAsciiWhitespace(text));
  size_t i = 0;
  while (i < t.size() && (absl::ascii_isdigit(t[i]) || t[i] == '.')) ++i;
  double v = 0;
  if (i == 0 || !absl::SimpleAtod(t.substr(0, i), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size (e.g. 2GiB)"));
  }
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(i)));
  static const std::vector<std::pair<std::string, double>> kUnits = {{"", 1},
                                                                     {"b", 1},
                                                                     {"k", 1e3},
                                                                     {"kb", 1e3},
                                                                     {"m", 1e6},
                                                                     {"mb", 1e6},
                                                                     {"g", 1e9},
                                                                     {"gb", 1e9},
                                                                     {"ki", 1024.0},
                                                                     {"kib", 1024.0},
                                                                     {"mi", 1048576.0},
                                                                     {"mib", 1048576.0},
                                                                     {"gi", 1073741824.0},
                                                                     {"gib", 1073741824.0}};
  for (const auto& [name, scale] : kUnits) {
    if (name == unit) return static_cast<int64_t>(std::llround(v * scale));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "': unknown unit '", unit, "' (B, KB, MB, GB, KiB, MiB, GiB)"));
}

}  // namespace stagewise
