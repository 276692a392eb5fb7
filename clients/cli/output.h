// The CLI's structured output: every -o json and -o yaml document is built
// as a typed value (nlohmann::ordered_json: keys keep their order) and
// printed here, so strings are always strings (a job named ".inf" or "true"
// stays one in YAML) and what does not exist yet is null, not 0.
// The job schema shared by local, submit, status, watch and train-local is
// documented in docs/cli.md ("Output schema"); kSchemaVersion is its version.
#ifndef STAGEWISE_CLIENTS_CLI_OUTPUT_H_
#define STAGEWISE_CLIENTS_CLI_OUTPUT_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace stagewise::cli {

using Json = nlohmann::ordered_json;

// The version of the documented output schema (`schema_version` in a job).
inline constexpr int kSchemaVersion = 1;

// A double: null when it is not finite.
Json Number(double v);
// Null when absent.
Json Optional(const std::optional<double>& v);
// Null when empty.
Json NonEmpty(const std::string& s);

// One line of JSON (UTF-8; invalid bytes replaced, never an exception).
std::string JsonLine(const Json& doc);

// The same value as YAML: maps and lists in block style, every string
// double-quoted, null as null.
std::string YamlOf(const Json& doc);

}  // namespace stagewise::cli

#endif  // STAGEWISE_CLIENTS_CLI_OUTPUT_H_
