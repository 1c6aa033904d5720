#include "ddprun/launcher/json.h"

namespace ddprun::launcher {
namespace {

struct TooDeep {};

std::optional<nlohmann::json> parse_once(const std::string& text, std::string* error) {
  const nlohmann::json::parser_callback_t depth_guard = [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text, depth_guard);
  } catch (const TooDeep&) {
    if (error) *error = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
  } catch (const nlohmann::json::exception& e) {
    if (error) *error = e.what();
  }
  return std::nullopt;
}

template <class BasicJson>
std::string dump_replacing(const BasicJson& v) {
  std::string text = v.dump(-1, ' ', false, BasicJson::error_handler_t::replace);
  // 0x7F is never part of a UTF-8 sequence nor of JSON's syntax: each one is a DEL in a string.
  for (size_t at = text.find('\x7f'); at != std::string::npos; at = text.find('\x7f', at))
    text.replace(at, 1, "\\u007f");
  return text;
}

}  // namespace

std::string dump_json(const nlohmann::json& v) { return dump_replacing(v); }
std::string dump_json(const nlohmann::ordered_json& v) { return dump_replacing(v); }

std::string valid_utf8(std::string_view s) {
  // nlohmann's replacing dump, read back: the string with U+FFFD where it was not UTF-8.
  const nlohmann::json v = std::string(s);
  return nlohmann::json::parse(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)).get<std::string>();
}

std::optional<nlohmann::json> parse_untrusted_json(const std::string& text, std::string* error) {
  if (auto doc = parse_once(text, error)) return doc;
  const std::string clean = valid_utf8(text);
  if (clean == text) return std::nullopt;
  return parse_once(clean, error);
}

}  // namespace ddprun::launcher
