#include "ddprun/launcher/log_format.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace ddprun::launcher {

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  uint32_t min = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) n = 2, min = 0x80;
  else if ((c & 0xF0) == 0xE0) n = 3, min = 0x800;
  else if ((c & 0xF8) == 0xF0) n = 4, min = 0x10000;
  else return 0;
  if (i + n > s.size()) return 0;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void append_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    const size_t n = utf8_length(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  out.push_back('"');
}

void append_value(std::string& out, const LogFieldValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    out += std::to_string(*i);
  } else if (const auto* d = std::get_if<double>(&v)) {
    if (!std::isfinite(*d)) {
      out += "null";  // JSON has no NaN or infinity
    } else {
      char buf[32];
      const auto res = std::to_chars(buf, buf + sizeof buf, *d);  // the shortest text that reads back the same
      out.append(buf, res.ptr);
    }
  } else if (const auto* b = std::get_if<bool>(&v)) {
    out += *b ? "true" : "false";
  } else {
    append_string(out, std::get<std::string>(v));
  }
}

void append_time(std::string& out, std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto us = duration_cast<microseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  long frac = static_cast<long>(us % 1000000);
  if (frac < 0) frac += 1000000, --secs;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "\"%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ\"", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
  out += buf;
}

}  // namespace

std::string json_log_line(const LogRecord& r) {
  std::string out;
  out.reserve(160 + r.message.size());
  out += "{\"time\":";
  append_time(out, r.time);
  out += ",\"level\":";
  append_string(out, r.level);
  out += ",\"host\":";
  append_string(out, r.host);
  out += ",\"node\":";
  out += r.node_rank ? std::to_string(*r.node_rank) : "null";
  out += ",\"rank\":";
  out += r.rank ? std::to_string(*r.rank) : "null";
  out += ",\"event\":";
  append_string(out, r.event.empty() ? kLogEventPlain : r.event);
  out += ",\"message\":";
  append_string(out, r.message);
  out += ",\"fields\":{";
  if (r.fields) {
    bool first = true;
    for (const auto& f : *r.fields) {
      if (!first) out.push_back(',');
      first = false;
      append_string(out, f.key);
      out.push_back(':');
      append_value(out, f.value);
    }
  }
  out += "}}\n";
  return out;
}

std::optional<LogFormat> parse_log_format(std::string_view s) {
  if (s == "text") return LogFormat::Text;
  if (s == "json") return LogFormat::Json;
  return std::nullopt;
}

}  // namespace ddprun::launcher
