#include "options/values.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <charconv>
#include <cstdlib>
#include <sstream>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/signal_names.h"

namespace ddprun::launcher::opt {
namespace {

std::string upper(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out.push_back(static_cast<char>(std::toupper(c)));
  return out;
}

}  // namespace

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(trim(cur));
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

[[noreturn]] void bad(const std::string& flag, const std::string& value, const std::string& expected) {
  throw UsageError("--" + flag + ": invalid value '" + value + "'; expected " + expected);
}

std::optional<long long> to_int(const std::string& s) {
  std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  long long v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size()) return std::nullopt;
  return v;
}

int int_in(const std::string& flag, const std::string& value, long long lo, long long hi, const std::string& expected) {
  auto v = to_int(value);
  if (!v || *v < lo || *v > hi) bad(flag, value, expected);
  return static_cast<int>(*v);
}

double seconds(const std::string& flag, const std::string& value) {
  std::string t = trim(value);
  char* end = nullptr;
  double v = t.empty() ? -1 : std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !(v >= 0) || v > 1e7) {
    bad(flag, value, "a number of seconds >= 0");
  }
  return v;
}

bool truthy(const std::string& flag, const std::string& value) {
  std::string v;
  for (unsigned char c : trim(value)) v.push_back(static_cast<char>(std::tolower(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) return false;
  bad(flag, value, "1/0 or true/false (from PET_" + upper(flag) + ")");
}

bool boolean(const std::string& flag, const std::string& value) {
  std::string v;
  for (unsigned char c : trim(value)) v.push_back(static_cast<char>(std::tolower(c)));
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false") return false;
  bad(flag, value, "1/0 or true/false");
}

}  // namespace ddprun::launcher::opt

namespace ddprun::launcher {

using namespace opt;

int StdStreamSpec::for_rank(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? kStreamNone : it->second;
}

int parse_nproc_per_node(const std::string& value, const SystemInfo& sys) {
  const std::string flag = "nproc_per_node";
  const std::string forms = "a positive integer, cpu, gpu or auto";
  std::string v = trim(value);
  if (v == "cpu") return std::max(1, sys.cpu_count);
  if (v == "gpu") {
    if (sys.gpu_count <= 0) {
      throw UsageError("--nproc_per_node=gpu: no GPU visible (no /dev/nvidia[0-9]* and no "
                       "CUDA_VISIBLE_DEVICES entries); use an integer, cpu or auto");
    }
    return sys.gpu_count;
  }
  if (v == "auto") return sys.gpu_count > 0 ? sys.gpu_count : std::max(1, sys.cpu_count);
  return int_in(flag, value, 1, 1 << 16, forms);
}

std::pair<int, int> parse_nnodes(const std::string& value) {
  const std::string forms = "N or MIN:MAX with 1 <= MIN <= MAX";
  auto parts = split(value, ':');
  if (parts.size() == 1) {
    int n = int_in("nnodes", value, 1, 1 << 20, forms);
    return {n, n};
  }
  if (parts.size() != 2) bad("nnodes", value, forms);
  auto lo = to_int(parts[0]);
  auto hi = to_int(parts[1]);
  if (!lo || !hi || *lo < 1 || *hi < *lo || *hi > (1 << 20)) bad("nnodes", value, forms);
  return {static_cast<int>(*lo), static_cast<int>(*hi)};
}

StdStreamSpec parse_std_streams(const std::string& flag, const std::string& value) {
  const std::string forms = "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or per local rank like 0:3,1:0";
  StdStreamSpec spec;
  std::string v = trim(value);
  if (v.find(':') == std::string::npos) {
    spec.all = int_in(flag, value, 0, 3, forms);
    return spec;
  }
  for (const auto& item : split(v, ',')) {
    auto kv = split(item, ':');
    if (kv.size() != 2) bad(flag, value, forms);
    auto rank = to_int(kv[0]);
    auto mask = to_int(kv[1]);
    if (!rank || !mask || *rank < 0 || *rank > (1 << 16) || *mask < 0 || *mask > 3) {
      bad(flag, value, forms);
    }
    spec.per_rank[static_cast<int>(*rank)] = static_cast<int>(*mask);
  }
  return spec;
}

std::map<std::string, std::string> parse_rdzv_conf(const std::string& value) {
  std::map<std::string, std::string> conf;
  if (trim(value).empty()) return conf;
  for (const auto& item : split(value, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) bad("rdzv_conf", value, "k=v,... pairs");
    std::string key = trim(item.substr(0, eq));
    std::string val = trim(item.substr(eq + 1));
    if (key.find("timeout") != std::string::npos) {
      char* end = nullptr;
      double d = std::strtod(val.c_str(), &end);
      if (val.empty() || end != val.c_str() + val.size() || !(d > 0)) {
        bad("rdzv_conf", value, key + "=<seconds > 0>");
      }
    }
    conf[key] = val;
  }
  return conf;
}

std::vector<int> parse_signals(const std::string& value, const std::string& flag) {
  std::vector<int> out;
  const char* example = flag == "preempt_signals" ? "SIGUSR1,SIGTERM (or none)" : "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  for (const auto& name : split(value, ',')) {
    auto signo = signal_from_name(name);
    if (!signo || *signo == SIGKILL || *signo == SIGSTOP || *signo == SIGCHLD) {
      bad(flag, value, std::string("a comma-separated list of catchable signal names, e.g. ") + example);
    }
    out.push_back(*signo);
  }
  if (out.empty()) bad(flag, value, std::string("at least one signal name, e.g. ") + example);
  return out;
}

std::set<int> parse_local_ranks_filter(const std::string& value) {
  std::set<int> out;
  for (const auto& part : split(value, ',')) {
    if (part.empty()) continue;
    auto r = to_int(part);
    if (!r || *r < 0 || *r > (1 << 16)) {
      bad("local_ranks_filter", value, "a comma-separated list of local ranks, e.g. 0,2");
    }
    out.insert(static_cast<int>(*r));
  }
  if (out.empty()) bad("local_ranks_filter", value, "a comma-separated list of local ranks, e.g. 0,2");
  return out;
}

std::vector<std::string> parse_filter_list(const std::string& value) {
  // ",," is a literal comma, then every ',' separates; "" is one empty needle.
  std::vector<std::string> out(1);
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == ',' && i + 1 < value.size() && value[i + 1] == ',') {
      out.back() += ',';
      ++i;
    } else if (value[i] == ',') {
      out.emplace_back();
    } else {
      out.back() += value[i];
    }
  }
  return out;
}

void check_endpoint_host(const std::string& flag, const std::string& given, const std::string& host) {
  in6_addr a6{};
  const bool bad =
      host.empty() || (host.find(':') != std::string::npos && ::inet_pton(AF_INET6, host.c_str(), &a6) != 1);
  if (bad)
    throw UsageError(flag + "=" + given +
                     ": expected HOST[:PORT] (a name, an IPv4 address, or an IPv6 address in "
                     "brackets: [::1]:29400)");
}

HostPort parse_host_port(const std::string& flag, const std::string& value) {
  const std::string text = trim(value);
  HostPort hp;
  std::string port;
  if (!text.empty() && text.front() == '[') {  // [v6]:port
    auto close = text.find(']');
    if (close == std::string::npos) bad(flag, value, "host[:port]");
    hp.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') bad(flag, value, "host[:port]");
      port = text.substr(close + 2);
    }
  } else if (auto colon = text.rfind(':'); colon != std::string::npos && text.find(':') == colon) {
    hp.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  } else {
    hp.host = text;  // a name, an IPv4 address, or an IPv6 address without brackets (no port)
  }
  if (!port.empty()) {
    auto p = to_int(port);
    if (!p || *p < 0 || *p > 65535) bad(flag, value, "host[:port] with a port 0-65535");
    hp.port = static_cast<uint16_t>(*p);
  }
  return hp;
}

}  // namespace ddprun::launcher
