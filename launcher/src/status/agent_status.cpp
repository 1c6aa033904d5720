#include "ddprun/launcher/agent_status.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "ddprun/launcher/json.h"

namespace ddprun::launcher {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

template <class T>
std::string opt_json(const std::optional<T>& v) {
  if (!v) return "null";
  if constexpr (std::is_floating_point_v<T>) return number(*v);
  else return std::to_string(*v);
}

std::string rank_json(const RankStatus& r) {
  return "{\"rank\":" + std::to_string(r.rank) + ",\"local_rank\":" + std::to_string(r.local_rank) +
         ",\"pid\":" + std::to_string(r.pid) + ",\"state\":" + json_quote(r.state) +
         ",\"uptime_s\":" + number(r.uptime_s) + ",\"cpu_percent\":" + opt_json(r.cpu_percent) +
         ",\"rss_bytes\":" + opt_json(r.rss_bytes) + ",\"gpu_index\":" + opt_json(r.gpu_index) +
         ",\"gpu_utilization_percent\":" + opt_json(r.gpu_utilization_percent) +
         ",\"gpu_memory_bytes\":" + opt_json(r.gpu_memory_bytes) + "}";
}

// Readers: a missing or null field leaves the value as it was; a field of the wrong type is an
// error.
struct Reader {
  const Json& obj;
  std::string* error;
  bool ok = true;

  const Json* get(const char* key, Json::Type type) {
    const Json* f = obj.field(key);
    if (!f || f->type == Json::Type::Null) return nullptr;
    if (f->type != type) {
      if (ok && error) *error = std::string("field \"") + key + "\" has the wrong type";
      ok = false;
      return nullptr;
    }
    return f;
  }
  bool require(const char* key) {
    if (obj.field(key)) return true;
    if (ok && error) *error = std::string("field \"") + key + "\" is missing";
    ok = false;
    return false;
  }
  template <class T>
  void num(const char* key, T& out) {
    if (const Json* f = get(key, Json::Type::Number)) {
      try {
        if constexpr (std::is_floating_point_v<T>) out = std::stod(f->text);
        else out = static_cast<T>(std::stoll(f->text));
      } catch (const std::exception&) {
        if (ok && error) *error = std::string("field \"") + key + "\" is not a number";
        ok = false;
      }
    }
  }
  template <class T>
  void opt(const char* key, std::optional<T>& out) {
    T v{};
    if (obj.field(key) && obj.field(key)->type == Json::Type::Number) {
      num(key, v);
      out = v;
    } else {
      get(key, Json::Type::Number);  // null or absent: nothing; another type: an error
    }
  }
  void str(const char* key, std::string& out) {
    if (const Json* f = get(key, Json::Type::String)) out = f->text;
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

std::string status_to_json(const AgentStatus& s) {
  std::string ranks;
  for (const auto& r : s.ranks) ranks += (ranks.empty() ? "" : ",") + rank_json(r);
  return "{\"run_id\":" + json_quote(s.run_id) + ",\"host\":" + json_quote(s.host) +
         ",\"node_rank\":" + std::to_string(s.node_rank) + ",\"num_nodes\":" + std::to_string(s.num_nodes) +
         ",\"agent_pid\":" + std::to_string(s.agent_pid) + ",\"state\":" + json_quote(s.state) +
         ",\"attempt\":" + std::to_string(s.attempt) + ",\"max_restarts\":" + std::to_string(s.max_restarts) +
         ",\"restarts_used\":" + std::to_string(s.attempt) + ",\"restarts_left\":" +
         std::to_string(s.restarts_left()) + ",\"uptime_s\":" + number(s.uptime_s) +
         ",\"last_failure\":" +
         (s.last_failure.empty() ? std::string("null")
                                 : "{\"rank\":" + opt_json(s.last_failure_rank) +
                                       ",\"what\":" + json_quote(s.last_failure) + "}") +
         ",\"ranks\":[" + ranks + "]}";
}

std::string status_document_json(const std::vector<AgentStatus>& agents) {
  std::string out = "{\"version\":" + std::to_string(kStatusSchemaVersion) + ",\"agents\":[";
  for (size_t i = 0; i < agents.size(); ++i) out += (i ? "," : "") + status_to_json(agents[i]);
  return out + "]}";
}

namespace {
std::optional<AgentStatus> status_from_object(const Json& obj, std::string* error) {
  if (obj.type != Json::Type::Object) {
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
  if (const Json* f = r.get("last_failure", Json::Type::Object)) {
    Reader fr{*f, error};
    fr.opt("rank", s.last_failure_rank);
    fr.str("what", s.last_failure);
    r.ok = r.ok && fr.ok;
  }
  if (const Json* ranks = r.get("ranks", Json::Type::Array)) {
    for (const Json& item : ranks->items) {
      if (item.type != Json::Type::Object) {
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
  const auto doc = parse_json(text);
  if (!doc) {
    if (error) *error = "not a JSON object";
    return std::nullopt;
  }
  return status_from_object(*doc, error);
}

std::vector<AgentStatus> statuses_from_json_array(const std::string& text, std::string* error) {
  std::vector<AgentStatus> out;
  const auto doc = parse_json(text);
  if (!doc || doc->type != Json::Type::Array) {
    if (error) *error = "not a JSON array";
    return out;
  }
  for (const Json& item : doc->items) {
    std::string why;
    if (auto s = status_from_object(item, &why)) out.push_back(std::move(*s));
    else if (error && error->empty()) *error = why;
  }
  return out;
}

std::string format_status_table(const std::vector<AgentStatus>& agents) {
  bool gpus = false;
  for (const auto& a : agents)
    for (const auto& r : a.ranks)
      gpus = gpus || r.gpu_index || r.gpu_utilization_percent || r.gpu_memory_bytes;
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
      std::vector<std::string> c = {node, dash, dash, a.state, std::to_string(a.attempt), restarts,
                                    fmt_duration(a.uptime_s), dash, dash};
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
  if (!(wall_s > 0) || cpu_s_now < cpu_s_before) return std::nullopt;
  return 100.0 * (cpu_s_now - cpu_s_before) / wall_s;
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
