// ddprun's own lines as JSON lines (--log_format=json), pure: one JSON object per line with
// the time, level, host, node rank, worker rank, event, message and fields. The schema is in
// launcher/README.md ("JSON logs"). Workers' output is not touched: it keeps its own format.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ddprun::launcher {

enum class LogFormat { Text, Json };

using LogFieldValue = std::variant<int64_t, double, bool, std::string>;
struct LogField {
  std::string key;
  LogFieldValue value;
};

// Event names (the "event" member). A line logged without an event of its own is "log".
inline constexpr std::string_view kLogEventPlain = "log";

struct LogRecord {
  std::chrono::system_clock::time_point time;
  std::string_view level;  // "debug", "info", "warning", "error", "critical"
  std::string_view host;
  std::optional<int> node_rank;  // unset before the rendezvous assigned one
  std::optional<int> rank;       // the worker (global rank) the line is about, if one
  std::string_view event = kLogEventPlain;
  std::string_view message;
  const std::vector<LogField>* fields = nullptr;
};

// The record as one line of JSON, '\n' included. Strings are escaped as JSON requires (control
// characters as \n, \t or \u00XX); bytes that are not UTF-8 become U+FFFD, so every line parses.
std::string json_log_line(const LogRecord& r);

// Text mode: spdlog's pattern for ddprun's lines, "[ddprun] level: message", with
// --log_timestamps "2026-12-06 12:14:47.123 [ddprun] level: message" (local time).
std::string text_log_pattern(bool timestamps);
// "2026-12-06 12:14:47.123", local time, as text_log_pattern's timestamps.
std::string local_time_text(std::chrono::system_clock::time_point t);
// `text` with "<stamp> " before each of its lines (a text block printed as it is: the summary, the
// usage table).
std::string stamp_lines(std::string_view text, std::string_view stamp);

// Parses a --log_format value ("text" or "json"); nullopt otherwise.
std::optional<LogFormat> parse_log_format(std::string_view s);

}  // namespace ddprun::launcher
