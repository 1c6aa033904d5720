#include "ddprun/launcher/agent_status.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "ddprun/launcher/json.h"

namespace ddprun::launcher {
namespace {

using OJson = nlohmann::ordered_json;  // the documented key order (launcher/README.md)

// One decimal, as the table shows it.
double tenths(double v) { return std::round(v * 10) / 10; }

template <class T>
OJson opt_json(const std::optional<T>& v) {
  if (!v) return nullptr;
  if constexpr (std::is_floating_point_v<T>) return tenths(*v);
  else return *v;
}

OJson rank_json(const RankStatus& r) {
  return OJson{{"rank", r.rank},
               {"local_rank", r.local_rank},
               {"pid", r.pid},
               {"state", r.state},
               {"uptime_s", tenths(r.uptime_s)},
               {"cpu_percent", opt_json(r.cpu_percent)},
               {"rss_bytes", opt_json(r.rss_bytes)},
               {"gpu_index", opt_json(r.gpu_index)},
               {"gpu_utilization_percent", opt_json(r.gpu_utilization_percent)},
               {"gpu_memory_bytes", opt_json(r.gpu_memory_bytes)}};
}

OJson agent_json(const AgentStatus& s) {
  OJson ranks = OJson::array();
  for (const auto& r : s.ranks) ranks.push_back(rank_json(r));
  OJson failure = nullptr;
  if (!s.last_failure.empty()) failure = OJson{{"rank", opt_json(s.last_failure_rank)}, {"what", s.last_failure}};
  return OJson{{"run_id", s.run_id},
               {"host", s.host},
               {"node_rank", s.node_rank},
               {"num_nodes", s.num_nodes},
               {"agent_pid", s.agent_pid},
               {"state", s.state},
               {"attempt", s.attempt},
               {"max_restarts", s.max_restarts},
               {"restarts_used", s.attempt},
               {"restarts_left", s.restarts_left()},
               {"uptime_s", tenths(s.uptime_s)},
               {"last_failure", std::move(failure)},
               {"ranks", std::move(ranks)}};
}

// Other agents' text (or the rendezvous server's copy of it): invalid UTF-8 is replaced, never
// thrown on.
std::string dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }

// Readers: a missing or null field leaves the value as it was; a field of the wrong type is an
// error.
struct Reader {
  const nlohmann::json& obj;
  std::string* error;
  bool ok = true;

  void fail(const char* key, const char* what) {
    if (ok && error) *error = std::string("field \"") + key + "\" " + what;
    ok = false;
  }
  const nlohmann::json* get(const char* key, nlohmann::json::value_t type) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    const bool number = type == nlohmann::json::value_t::number_float;
    if (number ? !it->is_number() : it->type() != type) {
      fail(key, "has the wrong type");
      return nullptr;
    }
    return &*it;
  }
  bool require(const char* key) {
    if (obj.contains(key)) return true;
    fail(key, "is missing");
    return false;
  }
  template <class T>
  void num(const char* key, T& out) {
    const nlohmann::json* f = get(key, nlohmann::json::value_t::number_float);
    if (!f) return;
    const double d = f->get<double>();
    if constexpr (std::is_floating_point_v<T>) {
      out = static_cast<T>(d);
    } else if (f->is_number_unsigned() && std::in_range<T>(f->get<uint64_t>())) {
      out = static_cast<T>(f->get<uint64_t>());
    } else if (f->is_number_integer() && std::in_range<T>(f->get<int64_t>())) {
      out = static_cast<T>(f->get<int64_t>());
    } else if (f->is_number_float() && std::isfinite(d) && d >= static_cast<double>(std::numeric_limits<T>::min()) &&
               d <= static_cast<double>(std::numeric_limits<T>::max())) {
      out = static_cast<T>(d);
    } else {
      fail(key, "is not a number");
    }
  }
  template <class T>
  void opt(const char* key, std::optional<T>& out) {
    T v{};
    const auto it = obj.find(key);
    if (it != obj.end() && it->is_number()) {
      num(key, v);
      out = v;
    } else {
      get(key, nlohmann::json::value_t::number_float);  // null or absent: nothing; another type: an error
    }
  }
  void str(const char* key, std::string& out) {
    if (const nlohmann::json* f = get(key, nlohmann::json::value_t::string)) out = f->get<std::string>();
  }
};

std::string fmt_duration(double s) {
  const long t = static_cast<long>(s < 0 ? 0 : s);
  char buf[32];
  if (t >= 86400) std::snprintf(buf, sizeof buf, "%ldd%02ldh", t / 86400, t % 86400 / 3600);
  else if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t % 3600 / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string fmt_bytes(uint64_t b) {
  char buf[32];
  const double mib = static_cast<double>(b) / (1024.0 * 1024.0);
  if (mib >= 1024) std::snprintf(buf, sizeof buf, "%.1f GiB", mib / 1024);
  else std::snprintf(buf, sizeof buf, "%.0f MiB", mib);
  return buf;
}

void sanitize(std::string& s) {
  for (char& ch : s)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
}

std::string fmt_percent(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", p);
  return buf;
}

}  // namespace

std::string status_to_json(const AgentStatus& s) { return dump(agent_json(s)); }

std::string status_document_json(const std::vector<AgentStatus>& agents) {
  OJson list = OJson::array();
  for (const auto& a : agents) list.push_back(agent_json(a));
  return dump(OJson{{"version", kStatusSchemaVersion}, {"agents", std::move(list)}});
}

namespace {
std::optional<AgentStatus> status_from_object(const nlohmann::json& obj, std::string* error) {
  if (!obj.is_object()) {
    if (error) *error = "not a JSON object";
    return std::nullopt;
  }
  AgentStatus s;
  Reader r{obj, error};
  for (const char* key : {"run_id", "node_rank", "agent_pid", "attempt", "ranks"}) r.require(key);
  r.str("run_id", s.run_id);
  r.str("host", s.host);
  r.num("node_rank", s.node_rank);
  r.num("num_nodes", s.num_nodes);
  r.num("agent_pid", s.agent_pid);
  r.str("state", s.state);
  r.num("attempt", s.attempt);
  r.num("max_restarts", s.max_restarts);
  r.num("uptime_s", s.uptime_s);
  if (const nlohmann::json* f = r.get("last_failure", nlohmann::json::value_t::object)) {
    Reader fr{*f, error};
    fr.opt("rank", s.last_failure_rank);
    fr.str("what", s.last_failure);
    r.ok = r.ok && fr.ok;
  }
  if (const nlohmann::json* ranks = r.get("ranks", nlohmann::json::value_t::array)) {
    for (const nlohmann::json& item : *ranks) {
      if (!item.is_object()) {
        if (r.ok && error) *error = "an entry of \"ranks\" is not an object";
        return std::nullopt;
      }
      RankStatus rs;
      Reader rr{item, error};
      rr.require("rank");
      rr.num("rank", rs.rank);
      rr.num("local_rank", rs.local_rank);
      rr.num("pid", rs.pid);
      rr.str("state", rs.state);
      rr.num("uptime_s", rs.uptime_s);
      rr.opt("cpu_percent", rs.cpu_percent);
      rr.opt("rss_bytes", rs.rss_bytes);
      rr.opt("gpu_index", rs.gpu_index);
      rr.opt("gpu_utilization_percent", rs.gpu_utilization_percent);
      rr.opt("gpu_memory_bytes", rs.gpu_memory_bytes);
      if (!rr.ok) return std::nullopt;
      s.ranks.push_back(std::move(rs));
    }
  }
  if (!r.ok) return std::nullopt;
  return s;
}
}  // namespace

std::optional<AgentStatus> status_from_json(const std::string& text, std::string* error) {
  // Another agent's answer: bounded nesting, bytes that are not UTF-8 read as U+FFFD.
  const auto doc = parse_untrusted_json(text);
  if (!doc) {
    if (error) *error = "not a JSON object";
    return std::nullopt;
  }
  return status_from_object(*doc, error);
}

std::vector<AgentStatus> statuses_from_json_array(const std::string& text, std::string* error) {
  std::vector<AgentStatus> out;
  const auto doc = parse_untrusted_json(text);
  if (!doc || !doc->is_array()) {
    if (error) *error = "not a JSON array";
    return out;
  }
  for (const nlohmann::json& item : *doc) {
    std::string why;
    if (auto s = status_from_object(item, &why)) out.push_back(std::move(*s));
    else if (error && error->empty()) *error = why;
  }
  return out;
}

std::string format_status_table(const std::vector<AgentStatus>& agents) {
  bool gpus = false;
  for (const auto& a : agents)
    for (const auto& r : a.ranks) gpus = gpus || r.gpu_index || r.gpu_utilization_percent || r.gpu_memory_bytes;
  std::vector<std::string> head = {"NODE", "RANK", "PID", "STATE", "ATTEMPT", "RESTARTS", "UPTIME", "CPU%", "RSS"};
  if (gpus) head.insert(head.end(), {"GPU", "GPU%", "GPU MEM"});
  head.push_back("LAST FAILURE");
  // Rows grouped by job: a job's title line, then its ranks.
  struct Row {
    std::string title;  // a job's line when not empty
    std::vector<std::string> cells;
  };
  std::vector<Row> rows;
  const std::string dash = "-";
  std::string job;
  for (const auto& a : agents) {
    if (rows.empty() || a.run_id != job) {
      job = a.run_id;
      rows.push_back({"job " + a.run_id, {}});
    }
    const std::string node = std::to_string(a.node_rank) + (a.host.empty() ? "" : " (" + a.host + ")");
    const std::string restarts = std::to_string(a.attempt) + " used, " + std::to_string(a.restarts_left()) + " left";
    if (a.ranks.empty()) {
      std::vector<std::string> c = {
          node, dash, dash, a.state, std::to_string(a.attempt), restarts, fmt_duration(a.uptime_s), dash, dash};
      if (gpus) c.insert(c.end(), {dash, dash, dash});
      c.push_back(a.last_failure.empty() ? dash : a.last_failure);
      rows.push_back({"", std::move(c)});
      continue;
    }
    // The last failure goes on the row of the rank that failed (the first row when it is not here).
    size_t failure_row = 0;
    for (size_t i = 0; i < a.ranks.size(); ++i)
      if (a.last_failure_rank && a.ranks[i].rank == *a.last_failure_rank) failure_row = i;
    for (size_t i = 0; i < a.ranks.size(); ++i) {
      const RankStatus& r = a.ranks[i];
      std::vector<std::string> c = {node,
                                    std::to_string(r.rank),
                                    r.pid > 0 ? std::to_string(r.pid) : dash,
                                    r.state,
                                    std::to_string(a.attempt),
                                    restarts,
                                    fmt_duration(r.uptime_s),
                                    r.cpu_percent ? fmt_percent(*r.cpu_percent) : dash,
                                    r.rss_bytes ? fmt_bytes(*r.rss_bytes) : dash};
      if (gpus) {
        c.push_back(r.gpu_index ? std::to_string(*r.gpu_index) : dash);
        c.push_back(r.gpu_utilization_percent ? fmt_percent(*r.gpu_utilization_percent) : dash);
        c.push_back(r.gpu_memory_bytes ? fmt_bytes(*r.gpu_memory_bytes) : dash);
      }
      c.push_back(i == failure_row && !a.last_failure.empty() ? a.last_failure : dash);
      rows.push_back({"", std::move(c)});
    }
  }
  // What agents wrote reaches a terminal: no control byte (an escape sequence) gets through.
  for (auto& row : rows) {
    sanitize(row.title);
    for (auto& cell : row.cells) sanitize(cell);
  }
  std::vector<size_t> width(head.size());
  for (size_t k = 0; k < head.size(); ++k) width[k] = head[k].size();
  for (const auto& row : rows)
    for (size_t k = 0; k < row.cells.size(); ++k) width[k] = std::max(width[k], row.cells[k].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t k = 0; k < cells.size(); ++k) {
      out += cells[k];
      if (k + 1 < cells.size()) out += std::string(width[k] - cells[k].size() + 2, ' ');
    }
    return out + "\n";
  };
  std::string out = line(head);
  for (const auto& row : rows) out += row.title.empty() ? line(row.cells) : row.title + "\n";
  return out;
}

std::optional<double> cpu_percent(double cpu_s_before, double cpu_s_now, double wall_s) {
  if (!(wall_s >= kMinCpuWindowS) || cpu_s_now < cpu_s_before) return std::nullopt;
  return 100.0 * (cpu_s_now - cpu_s_before) / wall_s;
}

double first_cpu_window_s(double rank_uptime_s, std::optional<double> process_age_s) {
  return process_age_s && *process_age_s > rank_uptime_s ? *process_age_s : rank_uptime_s;
}

void assign_gpu_samples(std::vector<RankSample>& ranks, const std::vector<GpuDeviceSample>& devices,
                        const std::function<std::optional<pid_t>(pid_t)>& process_group_of) {
  // Per rank (its pid, the leader of its process group): the memory on each device.
  std::map<pid_t, std::map<int, uint64_t>> use;
  std::map<pid_t, bool> is_rank;
  for (const auto& r : ranks)
    if (r.pid > 0) is_rank[r.pid] = true;
  for (const auto& d : devices) {
    for (const auto& p : d.processes) {
      pid_t leader = p.pid;
      if (!is_rank.count(leader)) {
        const auto g = process_group_of(p.pid);
        if (!g || !is_rank.count(*g)) continue;
        leader = *g;
      }
      use[leader][d.index] += p.used_bytes;
    }
  }
  for (auto& r : ranks) {
    auto it = use.find(r.pid);
    if (r.pid <= 0 || it == use.end()) continue;
    const auto best = std::max_element(it->second.begin(), it->second.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    r.gpu_index = best->first;
    r.gpu_memory_bytes = best->second;
    for (const auto& d : devices)
      if (d.index == best->first && d.utilization_percent) r.gpu_utilization = *d.utilization_percent / 100.0;
  }
}

}  // namespace ddprun::launcher
