#include "ddprun/launcher/log_format.h"

#include <cstdio>
#include <ctime>

#include "ddprun/launcher/json.h"

namespace ddprun::launcher {

namespace {

nlohmann::ordered_json value_json(const LogFieldValue& v) {
  return std::visit([](const auto& x) { return nlohmann::ordered_json(x); }, v);  // NaN and infinity dump as null
}

// `t` as "2026-12-06T12:38:23.976123Z" (UTC, microseconds: the JSON lines) or, local, as
// "2026-12-06 12:38:23.976" (milliseconds: --log_timestamps).
std::string time_text(std::chrono::system_clock::time_point t, bool utc = true) {
  using namespace std::chrono;
  const long long unit = utc ? 1000000 : 1000;
  const auto ticks = utc ? duration_cast<microseconds>(t.time_since_epoch()).count()
                         : duration_cast<milliseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ticks / unit);
  long frac = static_cast<long>(ticks % unit);
  if (frac < 0) frac += unit, --secs;
  std::tm tm{};
  if (utc) gmtime_r(&secs, &tm);
  else localtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, utc ? "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ" : "%04d-%02d-%02d %02d:%02d:%02d.%03ld",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
  return buf;
}

nlohmann::ordered_json optional_int(const std::optional<int>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

std::string json_log_line(const LogRecord& r) {
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  if (r.fields) {
    for (const auto& f : *r.fields) fields[f.key] = value_json(f.value);
  }
  const nlohmann::ordered_json line = {
      {"time", time_text(r.time)},
      {"level", r.level},
      {"host", r.host},
      {"node", optional_int(r.node_rank)},
      {"rank", optional_int(r.rank)},
      {"event", r.event.empty() ? kLogEventPlain : r.event},
      {"message", r.message},
      {"fields", std::move(fields)},
  };
  return dump_json(line) + "\n";
}

std::string text_log_pattern(bool timestamps) {
  return timestamps ? "%Y-%m-%d %H:%M:%S.%e [ddprun] %^%l%$: %v" : "[ddprun] %^%l%$: %v";
}

std::string local_time_text(std::chrono::system_clock::time_point t) { return time_text(t, /*utc=*/false); }

std::string stamp_lines(std::string_view text, std::string_view stamp) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    end = end == std::string_view::npos ? text.size() : end + 1;
    out.append(stamp).append(" ").append(text.substr(at, end - at));
    at = end;
  }
  return out;
}

std::optional<LogFormat> parse_log_format(std::string_view s) {
  if (s == "text") return LogFormat::Text;
  if (s == "json") return LogFormat::Json;
  return std::nullopt;
}

}  // namespace ddprun::launcher
