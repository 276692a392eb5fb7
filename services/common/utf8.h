// UTF-8 hygiene for text that crosses a boundary. Protocol buffers refuse to
// parse a `string` field that is not UTF-8, so text the coordinator stores or
// sends (job reasons, names, error messages) must stay valid UTF-8, also
// after it is cut short.
#ifndef STAGEWISE_SERVICES_COMMON_UTF8_H_
#define STAGEWISE_SERVICES_COMMON_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace stagewise {

// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// `text` with each byte that does not start or continue a well-formed UTF-8
// character replaced by '?'.
std::string ToValidUtf8(absl::string_view text);

// The longest prefix of `text` of at most `max_bytes` bytes that does not end
// inside a character.
absl::string_view Utf8Prefix(absl::string_view text, size_t max_bytes);

}  // namespace stagewise

#endif  // STAGEWISE_SERVICES_COMMON_UTF8_H_
