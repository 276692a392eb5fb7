#include "clients/cli/output.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

#include "absl/strings/ascii.h"

namespace stagewise::cli {
namespace {

// A key YAML reads back as the same string when written plain: a letter or
// underscore, then letters, digits, underscores, dots and dashes; not a word
// YAML 1.1 reads as a boolean or null.
bool IsPlainKey(const std::string& key) {
  if (key.empty() || !(absl::ascii_isalpha(key[0]) || key[0] == '_')) return false;
  for (const char c : key) {
    if (!(absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-')) return false;
  }
  const std::string lower = absl::AsciiStrToLower(key);
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}) {
    if (lower == word) return false;
  }
  return true;
}

void Emit(YAML::Emitter& out, const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [key, value] : v.items()) {
        out << YAML::Key;
        if (IsPlainKey(key)) {
          out << key;
        } else {
          out << YAML::DoubleQuoted << key;
        }
        out << YAML::Value;
        Emit(out, value);
      }
      out << YAML::EndMap;
      break;
    case Json::value_t::array:
      out << YAML::BeginSeq;
      for (const Json& item : v) Emit(out, item);
      out << YAML::EndSeq;
      break;
    case Json::value_t::string:
      out << YAML::DoubleQuoted << v.get<std::string>();
      break;
    case Json::value_t::boolean:
      out << (v.get<bool>() ? "true" : "false");
      break;
    case Json::value_t::number_integer:
      out << v.get<int64_t>();
      break;
    case Json::value_t::number_unsigned:
      out << v.get<uint64_t>();
      break;
    case Json::value_t::number_float: {
      const double d = v.get<double>();
      if (std::isfinite(d)) {
        out << v.dump();  // the shortest text that reads back as `d`
      } else {
        out << YAML::Null;
      }
      break;
    }
    default:
      out << YAML::Null;
  }
}

}  // namespace

Json Number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

Json Optional(const std::optional<double>& v) { return v.has_value() ? Number(*v) : Json(nullptr); }

Json NonEmpty(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

std::string JsonLine(const Json& doc) {
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string YamlOf(const Json& doc) {
  YAML::Emitter out;
  out.SetMapFormat(YAML::Block);
  out.SetSeqFormat(YAML::Block);
  out.SetNullFormat(YAML::LowerNull);
  Emit(out, doc);
  return out.c_str();
}

}  // namespace stagewise::cli
