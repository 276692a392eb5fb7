// Each key of the job spec declared once: its name, type, default, allowed
// values and doc line. The parser reads a section by walking its list, the
// "unknown key (did you mean ...?)" check takes its key names from it, and
// docs/job_spec.md's tables are generated from it (tests/unit/spec_docs_test.cc
// checks the page against SectionTable / AlgorithmTable). Internal to
// services/spec/ and its tests.
#ifndef STAGEWISE_SERVICES_SPEC_FIELDS_H_
#define STAGEWISE_SERVICES_SPEC_FIELDS_H_

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "services/spec/job_spec.h"
#include "services/spec/yaml_reader.h"

namespace stagewise::spec {

// ---------------------------------------------------------------------------
// A numeric key's allowed values: a lower and/or an upper bound, each closed
// or open. The docs' "allowed" column and the check come from the same Range.

struct Range {
  std::optional<double> min;
  std::optional<double> max;
  bool min_open = false;
  bool max_open = false;

  // NaN is in no range.
  bool Contains(double value) const {
    if (std::isnan(value)) return false;
    if (min.has_value() && (min_open ? value <= *min : value < *min)) return false;
    if (max.has_value() && (max_open ? value >= *max : value > *max)) return false;
    return true;
  }
  // ">= 1", "> 0", "[0, 1)", "(0, 1000]".
  std::string Text() const;
  // OK, or INVALID_ARGUMENT "<path>: must be <Text>, got <value>".
  absl::Status Check(absl::string_view path, double value) const;
};
inline Range AtLeast(double min) { return Range{min, std::nullopt, false, false}; }
inline Range Above(double min) { return Range{min, std::nullopt, true, false}; }
// [min, max], with either end open on request.
inline Range Between(double min, double max, bool min_open = false, bool max_open = false) {
  return Range{min, max, min_open, max_open};
}

// ---------------------------------------------------------------------------
// Keys of a plain section (a map of scalars and lists into struct S).

template <typename S>
struct Field {
  std::string key;
  std::string type;          // as the docs show it: int, number, bool, string, list of int
  std::string default_text;  // as the docs show it: `1`, `""`, — (required)
  std::string allowed;       // the docs' "allowed" column
  // Reads the key into *out when present; null for keys with a parser of
  // their own (algorithm, stages, trace, phases and the sub-sections).
  std::function<void(Section&, S*)> read;
  // Checks the value against the key's Range (a list: each entry), naming
  // "<section>.<key>[i]"; null for keys without one.
  std::function<absl::Status(const S&, absl::string_view section)> check = nullptr;
};

// How a default is shown in the docs.
inline std::string ValueText(int v) { return absl::StrCat(v); }
inline std::string ValueText(int64_t v) { return absl::StrCat(v); }
inline std::string ValueText(double v) { return FormatDouble(v); }
inline std::string ValueText(bool v) { return v ? "true" : "false"; }
inline std::string ValueText(const std::string& v) { return v.empty() ? "\"\"" : v; }
template <typename E, typename = decltype(EnumSpellings<E>::kNames)>
std::string ValueText(E v) {
  return std::string(NameOf(v));
}
template <typename T>
std::string ValueText(const std::vector<T>& v) {
  std::vector<std::string> parts;
  for (const T& x : v) parts.push_back(ValueText(x));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

template <typename T>
std::string TypeText() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_integral_v<T>) return "int";
  if constexpr (std::is_floating_point_v<T>) return "number";
  if constexpr (std::is_enum_v<T> || std::is_same_v<T, std::string>) return "string";
  if constexpr (std::is_same_v<T, std::vector<double>>) return "list of number";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "list of string";
  if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, std::vector<int64_t>>) {
    return "list of int";
  }
  return "?";
}

// A key read into S::*member; the type and default come from the member and
// from S's default-constructed value unless `default_text` says otherwise.
template <typename S, typename T>
Field<S> Key(std::string key, T S::*member, std::string allowed, std::string default_text = "") {
  Field<S> field;
  field.key = key;
  field.type = TypeText<T>();
  field.default_text =
      default_text.empty() ? absl::StrCat("`", ValueText(S{}.*member), "`") : default_text;
  field.allowed = std::move(allowed);
  field.read = [key, member](Section& section, S* out) { section.Read(key, &(out->*member)); };
  return field;
}

// A numeric key (or a list of numbers) with its range: the "allowed" column is
// the range ("each" for a list) followed by `note`, and the check is the
// range's.
template <typename S, typename T>
Field<S> Key(std::string key, T S::*member, Range range, absl::string_view note,
             std::string default_text = "") {
  constexpr bool kList = !std::is_arithmetic_v<T>;
  Field<S> field = Key(
      key, member,
      absl::StrCat(kList ? "each " : "", "`", range.Text(), "`", note.empty() ? "" : "; ", note),
      std::move(default_text));
  field.check = [key, member, range](const S& s, absl::string_view section) -> absl::Status {
    const std::string path = section.empty() ? key : absl::StrCat(section, ".", key);
    if constexpr (kList) {
      const T& values = s.*member;
      for (size_t i = 0; i < values.size(); ++i) {
        absl::Status status =
            range.Check(absl::StrCat(path, "[", i, "]"), static_cast<double>(values[i]));
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    } else {
      return range.Check(path, static_cast<double>(s.*member));
    }
  };
  return field;
}

// The first key of `fields` whose value is out of its range.
template <typename S>
absl::Status CheckRanges(const std::vector<Field<S>>& fields, absl::string_view section,
                         const S& s) {
  for (const Field<S>& f : fields) {
    if (!f.check) continue;
    absl::Status status = f.check(s, section);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// A key with a parser of its own: only its docs row and its name.
template <typename S>
Field<S> Custom(std::string key, std::string type, std::string default_text, std::string allowed) {
  return Field<S>{std::move(key), std::move(type), std::move(default_text), std::move(allowed),
                  nullptr};
}

template <typename S>
std::vector<std::string> KeyNames(const std::vector<Field<S>>& fields) {
  std::vector<std::string> names;
  for (const Field<S>& f : fields) names.push_back(f.key);
  return names;
}

// Checks the section's keys against `fields` and reads every plain one.
template <typename S>
absl::Status ReadFields(const std::vector<Field<S>>& fields, Section& section, S* out) {
  section.CheckKeys(KeyNames(fields));
  for (const Field<S>& f : fields) {
    if (f.read) f.read(section, out);
  }
  return section.status();
}

// The docs table of a section: | key | type | default | allowed |.
template <typename S>
std::string SectionTable(const std::vector<Field<S>>& fields) {
  std::string table = "| key | type | default | allowed |\n|---|---|---|---|\n";
  for (const Field<S>& f : fields) {
    absl::StrAppend(&table, "| `", f.key, "` | ", f.type, " | ", f.default_text, " | ", f.allowed,
                    " |\n");
  }
  return table;
}

// The sections with plain keys, in docs order.
const std::vector<Field<JobSpec>>& TopLevelFields();
const std::vector<Field<ModelSpec>>& ModelFields();
const std::vector<Field<DataSpec>>& DataFields();
const std::vector<Field<OptimizerSpec>>& OptimizerFields();
const std::vector<Field<ScheduleSpec>>& ScheduleFields();
const std::vector<Field<EvalSpec>>& EvalFields();
const std::vector<Field<CheckpointSpec>>& CheckpointFields();
const std::vector<Field<RecoverySpec>>& RecoveryFields();
const std::vector<Field<SyncSpec>>& SyncFields();
const std::vector<Field<PlacementSpec>>& PlacementFields();
const std::vector<Field<RebalanceSpec>>& RebalanceFields();
const std::vector<Field<TransportSpec>>& TransportFields();
// transport.forward and transport.backward.
const std::vector<Field<WireFormatSpec>>& WireFormatFields();

// ---------------------------------------------------------------------------
// Algorithm parameters: scalars with a type, a lower bound or a choice list,
// written into one alternative of AlgorithmOptions.

enum class ParamType { kInt, kDouble, kBool, kString, kEnum };

struct ParamField {
  std::string key;
  ParamType type = ParamType::kInt;
  Range range;                       // kInt and kDouble: the allowed values (docs and check)
  std::string auto_word;             // kInt: a word allowed beside the numbers ("auto")
  std::vector<std::string> choices;  // kEnum
  std::string doc;                   // after the range or the choices in the docs
  // Stores an already checked canonical value.
  std::function<void(AlgorithmOptions*, absl::string_view)> set;
  // The value in canonical text.
  std::function<std::string(const AlgorithmOptions&)> get;
};

struct AlgorithmSchema {
  AlgorithmKind kind;
  std::vector<ParamField> params;
  AlgorithmOptions defaults;  // the options struct, default-constructed
};

// One schema per algorithm, in AlgorithmKind order.
const std::vector<AlgorithmSchema>& AlgorithmSchemas();
const AlgorithmSchema* FindAlgorithm(absl::string_view name);
std::vector<std::string> ParamKeys(const AlgorithmSchema& schema);

// "unknown algorithm 'x' (did you mean y?); known: ..." or "required (...)".
std::string UnknownAlgorithmMessage(absl::string_view name);
// "unknown key for algorithm petra (known: accumulation, verify_rebuild, ...)".
std::string UnknownParamMessage(const AlgorithmSchema& schema, absl::string_view key);
// How type errors describe what a parameter takes ("an integer", ...).
const char* ExpectedText(ParamType type);

// Type- and range-checks one parameter value and returns its canonical text.
// Errors name "algorithm.<key>".
absl::StatusOr<std::string> CanonicalParam(const ParamField& param, absl::string_view text);

// The docs table: | algorithm | key | type | default | allowed |.
std::string AlgorithmTable();

}  // namespace stagewise::spec

#endif  // STAGEWISE_SERVICES_SPEC_FIELDS_H_
