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

}  // namespace

ErrorFileReport parse_error_file(const std::string& content) {
  ErrorFileReport r;
  auto doc = parse_json(content);
  if (!doc) {
    r.raw = bounded(trim_right(content));
    return r;
  }
  r.valid_json = true;
  const Json* msg = doc->field("message");
  if (msg && msg->type == Json::Type::Object) {
    if (const Json* inner = msg->field("message"); inner && inner->type == Json::Type::String) {
      r.message = inner->text;
    }
    if (const Json* extra = msg->field("extraInfo")) {
      if (const Json* cs = extra->field("py_callstack"); cs && cs->type == Json::Type::String) {
        r.traceback = cs->text;
      }
      if (const Json* ts = extra->field("timestamp"); ts && ts->type != Json::Type::Object) {
        r.timestamp = ts->text;
      }
    }
  } else if (msg && msg->type == Json::Type::String) {
    r.message = msg->text;
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
