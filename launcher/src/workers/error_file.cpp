#include "ddprun/launcher/error_file.h"

#include <cctype>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace ddprun::launcher {
namespace {

constexpr size_t kMaxRaw = 4096;
constexpr int kMaxDepth = 64;

// Just enough JSON for error files: objects, arrays, strings (with \u escapes), and scalars
// kept as their text.
struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  std::string text;  // String: the decoded value; Number/Bool: the literal
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json* field(const std::string& k) const {
    if (type != Type::Object) return nullptr;
    auto it = fields.find(k);
    return it == fields.end() ? nullptr : &it->second;
  }
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  std::optional<Json> parse_document() {
    Json v;
    if (!value(v, 0)) return std::nullopt;
    ws();
    if (i_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool literal(const char* lit) {
    size_t n = std::char_traits<char>::length(lit);
    if (s_.compare(i_, n, lit) != 0) return false;
    i_ += n;
    return true;
  }
  bool value(Json& v, int depth) {
    if (depth > kMaxDepth) return false;
    ws();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.type = Json::Type::String;
      return string(v.text);
    }
    if (literal("true") || literal("false")) {
      v.type = Json::Type::Bool;
      v.text = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u' ? "true" : "false";
      return true;
    }
    if (literal("null")) return true;
    size_t start = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
                              s_[i_] == '+' || s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
    }
    if (i_ == start) return false;
    v.type = Json::Type::Number;
    v.text = s_.substr(start, i_ - start);
    return true;
  }
  bool object(Json& v, int depth) {
    v.type = Json::Type::Object;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    while (true) {
      ws();
      std::string key;
      if (i_ >= s_.size() || s_[i_] != '"' || !string(key)) return false;
      ws();
      if (i_ >= s_.size() || s_[i_] != ':') return false;
      ++i_;
      Json child;
      if (!value(child, depth + 1)) return false;
      v.fields[key] = std::move(child);
      ws();
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == '}') {
        ++i_;
        return true;
      }
      return false;
    }
  }
  bool array(Json& v, int depth) {
    v.type = Json::Type::Array;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    while (true) {
      Json child;
      if (!value(child, depth + 1)) return false;
      v.items.push_back(std::move(child));
      ws();
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == ']') {
        ++i_;
        return true;
      }
      return false;
    }
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool hex4(unsigned& cp) {
    if (i_ + 4 > s_.size()) return false;
    cp = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') cp |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') cp |= static_cast<unsigned>(h - 'A' + 10);
      else return false;
    }
    return true;
  }
  bool string(std::string& out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          unsigned cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 6 <= s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            i_ += 2;
            unsigned lo = 0;
            if (!hex4(lo)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: return false;
      }
    }
    return false;
  }

  const std::string& s_;
  size_t i_ = 0;
};

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
  auto doc = Parser(content).parse_document();
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
