#include "ddprun/launcher/error_file.h"

#include "ddprun/launcher/json.h"

namespace ddprun::launcher {
namespace {

constexpr size_t kMaxRaw = 4096;

std::string bounded(const std::string& s) {
  if (s.size() <= kMaxRaw) return s;
  return s.substr(0, kMaxRaw) + "... (" + std::to_string(s.size() - kMaxRaw) + " more bytes)";
}

std::string trim_right(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// A member's text: a string's value, a number's or boolean's JSON; "" for anything else.
std::string scalar_text(const nlohmann::json* v) {
  if (!v) return "";
  if (v->is_string()) return v->get<std::string>();
  if (v->is_number() || v->is_boolean()) return v->dump();
  return "";
}

const nlohmann::json* member(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

}  // namespace

ErrorFileReport parse_error_file(const std::string& content) {
  ErrorFileReport r;
  const auto doc = parse_untrusted_json(content);
  if (!doc) {
    r.raw = bounded(trim_right(content));
    return r;
  }
  r.valid_json = true;
  const nlohmann::json* msg = member(*doc, "message");
  if (msg && msg->is_object()) {
    if (const auto* inner = member(*msg, "message"); inner && inner->is_string()) r.message = inner->get<std::string>();
    if (const auto* extra = member(*msg, "extraInfo")) {
      if (const auto* cs = member(*extra, "py_callstack"); cs && cs->is_string()) r.traceback = cs->get<std::string>();
      r.timestamp = scalar_text(member(*extra, "timestamp"));
    }
  } else if (msg && msg->is_string()) {
    r.message = msg->get<std::string>();
  }
  if (r.message.empty() && r.traceback.empty()) r.raw = bounded(trim_right(content));
  return r;
}

std::string format_error_file(const ErrorFileReport& report) {
  std::string out;
  if (!report.message.empty()) out += "  message: " + bounded(trim_right(report.message)) + "\n";
  if (!report.timestamp.empty()) out += "  timestamp: " + report.timestamp + "\n";
  if (!report.traceback.empty()) {
    out += "  traceback:\n";
    std::string tb = bounded(trim_right(report.traceback));
    size_t pos = 0;
    while (pos <= tb.size()) {
      size_t nl = tb.find('\n', pos);
      out += "    " + tb.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos) + "\n";
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  }
  if (!report.raw.empty()) {
    out += std::string(report.valid_json ? "  content: " : "  content (not JSON): ") + report.raw + "\n";
  }
  return trim_right(out);
}

bool says_config_error(int exit_code, bool signaled, const std::string* error_file_content) {
  if (signaled || exit_code != kConfigErrorExitCode || !error_file_content) return false;
  const ErrorFileReport report = parse_error_file(*error_file_content);
  return report.message.rfind("ConfigError", 0) == 0;
}

}  // namespace ddprun::launcher
