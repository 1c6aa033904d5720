// JSON that comes from elsewhere (a worker's error file, an agent's status answer), read with
// nlohmann-json: bounded nesting, bytes that are not UTF-8 replaced by U+FFFD, no exception out.
#pragma once

#include <optional>
#include <string>
#include <string_view>

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

}  // namespace ddprun::launcher
