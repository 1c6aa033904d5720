// JSON that comes from elsewhere (a worker's error file, an agent's status answer), read with
// nlohmann-json: bounded nesting, bytes that are not UTF-8 replaced by U+FFFD, no exception out.
// Json/parse_json: the same document as a plain tree whose numbers and booleans are text, for
// readers written against it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddprun::launcher {

// Nesting deeper than this is refused.
inline constexpr int kMaxJsonDepth = 64;

// One JSON document, or nullopt and *error: one line saying what is wrong and where.
std::optional<nlohmann::json> parse_untrusted_json(const std::string& text, std::string* error = nullptr);

// `s` with every byte that is not part of a UTF-8 character replaced by U+FFFD.
std::string valid_utf8(std::string_view s);

// `v` as one line of JSON; strings that are not UTF-8 get U+FFFD (one per bad sequence), never
// an exception. DEL is written \u007f, as the other control characters, so that no raw control
// byte reaches a terminal that shows the line.
std::string dump_json(const nlohmann::json& v);
std::string dump_json(const nlohmann::ordered_json& v);

struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  std::string text;  // String: the decoded value; Number/Bool: its JSON text
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  // The field `k` of an object; nullptr when absent or when this is not an object.
  const Json* field(const std::string& k) const {
    if (type != Type::Object) return nullptr;
    auto it = fields.find(k);
    return it == fields.end() ? nullptr : &it->second;
  }
};

// parse_untrusted_json as a Json tree.
std::optional<Json> parse_json(const std::string& text);

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

}  // namespace ddprun::launcher
