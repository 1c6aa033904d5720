// A small JSON reader and writer, pure: text in, a tree out (nullopt for text that is not one
// JSON document); never throws on bad input. Numbers and booleans keep their literal text.
// Enough for error files and the status snapshots, not a general-purpose library.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  std::string text;  // String: the decoded value; Number/Bool: the literal
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  // The field `k` of an object; nullptr when absent or when this is not an object.
  const Json* field(const std::string& k) const {
    if (type != Type::Object) return nullptr;
    auto it = fields.find(k);
    return it == fields.end() ? nullptr : &it->second;
  }
};

// One JSON document (nesting deeper than 64 levels is refused).
std::optional<Json> parse_json(const std::string& text);

// `s` as a JSON string literal, quotes included (control characters as \u00XX).
std::string json_quote(std::string_view s);

}  // namespace ddprun::launcher
