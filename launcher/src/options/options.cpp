#include "ddprun/launcher/options.h"

#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cstring>
#include <random>
#include <sstream>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/numa.h"
#include "ddprun/launcher/signal_names.h"
#include "ddprun/launcher/slurm.h"
#include "ddprun/rdzv/validate.h"

extern char** environ;

namespace ddprun::launcher {
namespace {

// Every flag, once: canonical name (torchrun's dest), short alias, whether it takes a value,
// and help. The dashed spelling and PET_<NAME> are derived from the name.
struct FlagSpec {
  const char* name;
  const char* short_name;  // "" when none
  bool takes_value;
  const char* help;
};

constexpr FlagSpec kFlags[] = {
    {"nproc_per_node", "", true, "workers on this node: an int, cpu, gpu or auto (default 1)"},
    {"nnodes", "", true, "number of nodes, N or MIN:MAX (elastic, c10d only; default 1)"},
    {"node_rank", "", true, "rank of this node, static rendezvous only (default 0)"},
    {"master_addr", "", true, "address of the store the workers use (default 127.0.0.1)"},
    {"master_port", "", true,
     "port of the store (default 29500, or a free port when 29500 is taken; 0 = a free port)"},
    {"rdzv_backend", "", true, "static (default) or c10d"},
    {"rdzv_endpoint", "", true, "host[:port] of the rendezvous (default port 29400)"},
    {"rdzv_id", "", true, "job id shared by every node (default none)"},
    {"rdzv_conf", "", true, "k=v,... (join_timeout, last_call_timeout, close_timeout, "
                            "read_timeout, is_host, ...)"},
    {"standalone", "", false, "single node, store on a free local port, random run id"},
    {"max_restarts", "", true, "restarts of the local worker group on failure (default 0)"},
    {"monitor_interval", "", true,
     "accepted for torchrun compatibility and unused: ddprun never polls, it learns of a "
     "worker's exit at once"},
    {"start_method", "", true, "accepted for torchrun compatibility (spawn, fork, forkserver); "
                               "ddprun always fork/execs"},
    {"role", "", true, "role of the workers (default 'default')"},
    {"module", "m", false, "run the entry point as a Python module (python -u -m ...)"},
    {"no_python", "", false, "run the entry point as a program, without Python"},
    {"run_path", "", false, "run the entry point with runpy.run_path"},
    {"log_dir", "", true, "directory for per-rank logs <log_dir>/<run_id>_<unique>/attempt_<n>/<rank>/ (a new <unique> every launch)"},
    {"redirects", "r", true, "streams to redirect to log files only: 0-3 or 0:3,1:0 per rank"},
    {"tee", "t", true, "streams to write to console and log files: 0-3 or 0:3,1:0 per rank"},
    {"local_ranks_filter", "", true, "only these local ranks print to the console, e.g. 0,2"},
    {"local_addr", "", true, "address this node advertises"},
    {"rdzv_token_file", "", true,
     "a file (mode 0600, yours) holding the rendezvous token, a shared secret of 16+ bytes: agents "
     "must prove they hold it (HMAC challenge-response, both ways) to join a multi-node job; the "
     "same on every node and on a standing ddprund. Without it, DDPRUN_RDZV_TOKEN; without "
     "either the rendezvous is open to anyone who can reach it"},
    {"signals_to_handle", "", true,
     "signals forwarded to the workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)"},
    {"shutdown_timeout", "", true, "seconds between SIGTERM and SIGKILL when stopping (default 30)"},
    {"preempt_signals", "", true,
     "signals that mean a preemption (default SIGUSR1, Slurm's usual warning; none = no such "
     "signal): forwarded to the workers, which get --preempt_grace to stop (write a checkpoint, "
     "exit); the job is then stopped, not restarted, and ddprun exits 99. A signal listed here "
     "and in --signals_to_handle is a preemption"},
    {"preempt_grace", "", true,
     "seconds the workers get after a preemption signal before they are stopped (SIGTERM, then "
     "SIGKILL after --shutdown_timeout; default 90)"},

    {"exit_barrier_timeout", "", true,
     "seconds the other local workers may run on once one has exited 0; then ddprun names the "
     "ranks still running, stops them (SIGTERM, SIGKILL after --shutdown_timeout) and exits 124. "
     "0 (default): no limit. (torchrun's agent has an exit_barrier_timeout too, 300 s, not a "
     "flag: how long finished nodes wait for the others)"},
    {"overlap_restart", "", true,
     "1 (default): on a failure that is restarted, start the next attempt at once while the old "
     "workers are stopped in the background; 0: wait until every old worker exited"},
    {"early_exit_watch", "", true,
     "1 (default): learn of a worker's exit as it starts (a seccomp listener, Linux 6.11+), not "
     "15-30 ms later when the kernel has freed it; without CAP_SYS_ADMIN this sets no_new_privs on "
     "the workers (setuid programs such as sudo then fail in them); 0: off"},
    {"warm_spares", "", true,
     "1: keep one Python interpreter per local worker with the --preload modules imported, and start "
     "a restart's workers from them (no `import torch` on the restart path); 0: off; default: on "
     "when --max_restarts > 0 and the entry point runs under Python"},
    {"preload", "", true, "modules a warm spare imports before it waits, comma-separated "
                          "(default torch,torch.distributed)"},
    {"spare_priority", "", true,
     "idle (default): spares import at SCHED_IDLE priority, on CPU time the job leaves unused (a preload that starts "
     "threads or needs the main thread is imported again at normal priority); "
     "normal: at the workers' priority (spares are ready sooner on a busy host)"},
    {"virtual_local_rank", "", false,
     "each worker sees only its own GPU as device 0 (LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=its GPU)"},
    {"duplicate_stdout_filters", "", true,
     "copy the tee'd stdout lines that contain any of these strings (comma-separated, ',,' is a "
     "comma) to <log dir>/<run>/attempt_<n>/filtered_stdout.log"},
    {"duplicate_stderr_filters", "", true,
     "the same for stderr: filtered_stderr.log"},
    {"logs_specs", "", true,
     "accepted for torchrun compatibility: names a Python torchrun.logs_specs plugin, which ddprun "
     "cannot load; it keeps its default log layout and warns"},
    {"event_log_handler", "", true,
     "accepted for torchrun compatibility: null (default), console or dynamic_rendezvous; ddprun "
     "records no torchelastic events (console warns)"},
    {"numa_binding", "", true,
     "bind each local rank to the CPUs near the GPU whose index is its local rank: node, socket, "
     "exclusive or core-complex (as torchrun 2.11; needs NVIDIA GPUs)"},
    {"no_slurm", "", false,
     "do not derive --nnodes, --node_rank, the rendezvous host, --rdzv_id and --nproc_per_node "
     "from the SLURM_* environment of an srun step"},
};

std::string dashed(std::string s) {
  for (char& c : s) {
    if (c == '_') c = '-';
  }
  return s;
}

std::string env_name(const std::string& name) {
  std::string out = "PET_";
  for (unsigned char c : name) out.push_back(static_cast<char>(std::toupper(c)));
  return out;
}

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

int int_in(const std::string& flag, const std::string& value, long long lo, long long hi,
           const std::string& expected) {
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
  bad(flag, value, "1/0 or true/false (from " + env_name(flag) + ")");
}

// A boolean flag that takes a value: 1/0 or true/false (any case).
bool boolean(const std::string& flag, const std::string& value) {
  std::string v;
  for (unsigned char c : trim(value)) v.push_back(static_cast<char>(std::tolower(c)));
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false") return false;
  bad(flag, value, "1/0 or true/false");
}

const FlagSpec* find_flag(const std::string& name) {
  for (const auto& f : kFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// An empty `--flag=` would make CLI11 take the next argument as the value (`--log_dir= x.py`
// ran with log_dir "x.py"). It is a usage error, except for the duplicate filters, where an
// empty value means "every line" (torchrun's): those are passed on as an explicit "".
// Scans only ddprun's own flags, up to the entry point.
void check_empty_values(std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--" || a.size() < 2 || a[0] != '-') return;  // the entry point
    if (a[1] != '-') {  // -r 3, -t 3 take a value; -m, -v do not
      if (a.size() == 2 && (a[1] == 'r' || a[1] == 't')) ++i;
      continue;
    }
    const size_t eq = a.find('=');
    std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    std::replace(name.begin(), name.end(), '-', '_');
    const FlagSpec* f = find_flag(name);
    if (!f || !f->takes_value) continue;
    if (eq == std::string::npos) {
      ++i;  // its value is the next argument
      continue;
    }
    if (eq + 1 < a.size()) continue;
    if (name == "duplicate_stdout_filters" || name == "duplicate_stderr_filters") {
      args[i] = a.substr(0, eq);
      args.insert(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, "");
      ++i;
      continue;
    }
    throw UsageError(a + ": an empty value; give --" + f->name + "=VALUE, or leave the flag out");
  }
}

std::string random_run_id() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(::getpid()));
  static const char hex[] = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 32; ++i) {
    id.push_back(hex[gen() & 15]);
    if (i == 7 || i == 11 || i == 15 || i == 19) id.push_back('-');
  }
  return id;
}

}  // namespace

int StdStreamSpec::for_rank(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? kStreamNone : it->second;
}

int count_visible_gpus(const EnvMap& env, int dev_nvidia_count) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end()) return dev_nvidia_count;
  int n = 0;
  for (const auto& part : split(it->second, ',')) {
    if (part.empty()) continue;
    // CUDA stops at the first invalid (negative) index.
    if (part[0] == '-') break;
    ++n;
  }
  return n;
}

SystemInfo probe_system(const EnvMap& env) {
  SystemInfo sys;
  long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  sys.cpu_count = cpus > 0 ? static_cast<int>(cpus) : 1;
  int devs = 0;
  if (DIR* d = ::opendir("/dev")) {
    while (dirent* e = ::readdir(d)) {
      const char* n = e->d_name;
      if (std::strncmp(n, "nvidia", 6) != 0 || n[6] == '\0') continue;
      bool digits = true;
      for (const char* p = n + 6; *p; ++p) digits = digits && std::isdigit(static_cast<unsigned char>(*p));
      if (digits) ++devs;
    }
    ::closedir(d);
  }
  sys.gpu_count = count_visible_gpus(env, devs);
  return sys;
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

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    env.emplace(std::string(const_cast<const char*>(*e), eq), std::string(eq + 1));
  }
  return env;
}

void setup_options(CLI::App& app, RawOptions& raw) {
  app.prefix_command();
  app.description(
      "ddprun: a torchrun-compatible launcher.\n"
      "  ddprun [options] script.py|program [args...]\n"
      "Every flag is accepted as --under_score and --dash-ed, and from PET_<FLAG> (the command "
      "line wins). A .py entry point runs as $PYTHON_EXEC -u script.py (PYTHON_EXEC unset: "
      "python3 from PATH).");
  app.footer(std::string(kExitCodeHelp) + "\n\nEnvironment knobs of ddprun itself:\n" + knobs::describe_all());
  for (const auto& f : kFlags) {
    std::string names;
    if (*f.short_name) names += std::string("-") + f.short_name + ",";
    names += std::string("--") + f.name;
    if (dashed(f.name) != f.name) names += ",--" + dashed(f.name);
    std::string name = f.name;
    std::string help = std::string(f.help) + " [env " + env_name(f.name) + "]";
    if (f.takes_value) {
      app.add_option_function<std::string>(
          names, [&raw, name](const std::string& v) { raw.given[name] = v; }, help);
    } else {
      app.add_flag_callback(names, [&raw, name]() { raw.given[name] = "1"; }, help);
    }
  }
  app.add_flag_callback("-v,--verbose", [&raw]() { raw.given["verbose"] = "1"; },
                        "debug logs from the agent");
}

LaunchOptions finalize_options(const RawOptions& raw, const EnvMap& env, const SystemInfo& sys) {
  // The command line wins over PET_<FLAG>.
  std::map<std::string, std::string> v = raw.given;
  for (const auto& f : kFlags) {
    if (v.count(f.name)) continue;
    auto it = env.find(env_name(f.name));
    if (it != env.end()) {
      if (!f.takes_value && !truthy(f.name, it->second)) continue;
      v[f.name] = f.takes_value ? it->second : "1";
    }
  }
  // Inside an srun step, Slurm's environment supplies the flags still missing (slurm.h).
  SystemInfo host = sys;
  std::optional<SlurmDerivation> slurm;
  if (!v.count("no_slurm")) {
    slurm = derive_from_slurm(env, v);
    for (const auto& [flag, value] : slurm->flags) v.emplace(flag, value);
    if (slurm->gpu_count) host.gpu_count = *slurm->gpu_count;
  }
  auto get = [&](const char* name) -> const std::string* {
    auto it = v.find(name);
    return it == v.end() ? nullptr : &it->second;
  };

  LaunchOptions o;
  if (slurm) {
    o.slurm_summary = slurm->summary;
    o.warnings = slurm->warnings;
  }
  if (raw.rest.empty()) {
    throw UsageError("missing entry point: expected `ddprun [options] script.py|program [args...]`");
  }
  if (!raw.rest[0].empty() && raw.rest[0][0] == '-') {
    throw UsageError("unrecognized flag '" + raw.rest[0] +
                     "'; see ddprun --help for the accepted flags");
  }
  o.entrypoint = raw.rest[0];
  o.args.assign(raw.rest.begin() + 1, raw.rest.end());

  o.standalone = get("standalone") != nullptr;
  o.module = get("module") != nullptr;
  o.no_python = get("no_python") != nullptr;
  o.run_path = get("run_path") != nullptr;
  o.virtual_local_rank = get("virtual_local_rank") != nullptr;
  o.verbosity = get("verbose") ? 1 : 0;
  if (int(o.module) + int(o.no_python) + int(o.run_path) > 1) {
    throw UsageError("--module, --no_python and --run_path are mutually exclusive");
  }

  if (auto s = get("nproc_per_node")) o.nproc_per_node = parse_nproc_per_node(*s, host);
  if (auto s = get("nnodes")) std::tie(o.min_nodes, o.max_nodes) = parse_nnodes(*s);
  if (auto s = get("node_rank")) o.node_rank = int_in("node_rank", *s, 0, 1 << 20, "an integer >= 0");
  if (auto s = get("master_addr")) {
    if (trim(*s).empty()) bad("master_addr", *s, "a host name or address");
    o.master_addr = trim(*s);
  }
  if (auto s = get("master_port")) {
    o.master_port = static_cast<uint16_t>(int_in("master_port", *s, 0, 65535, "a port 0-65535 (0 = a free port)"));
  }
  if (auto s = get("rdzv_backend")) {
    std::string b = trim(*s);
    if (b == "etcd" || b == "etcd-v2") {
      throw UsageError("--rdzv_backend=" + b + ": not supported by ddprun; expected static or c10d");
    }
    if (b != "static" && b != "c10d") bad("rdzv_backend", *s, "static or c10d");
    o.rdzv_backend = b;
  }
  if (auto s = get("rdzv_endpoint")) {
    o.rdzv_endpoint = trim(*s);
    std::string hostport = o.rdzv_endpoint;
    std::string port;
    if (!hostport.empty() && hostport.front() == '[') {  // [v6]:port
      auto close = hostport.find(']');
      if (close == std::string::npos) bad("rdzv_endpoint", *s, "host[:port]");
      o.rdzv_host = hostport.substr(1, close - 1);
      if (close + 1 < hostport.size()) {
        if (hostport[close + 1] != ':') bad("rdzv_endpoint", *s, "host[:port]");
        port = hostport.substr(close + 2);
      }
    } else if (auto colon = hostport.rfind(':'); colon != std::string::npos &&
                                                 hostport.find(':') == colon) {
      o.rdzv_host = hostport.substr(0, colon);
      port = hostport.substr(colon + 1);
    } else {
      o.rdzv_host = hostport;
    }
    if (!port.empty()) {
      auto p = to_int(port);
      if (!p || *p < 0 || *p > 65535) bad("rdzv_endpoint", *s, "host[:port] with a port 0-65535");
      o.rdzv_port = static_cast<uint16_t>(*p);
      o.rdzv_port_given = true;
    }
  }
  if (auto s = get("rdzv_id")) {
    o.rdzv_id = trim(*s).empty() ? "none" : trim(*s);
    // The rendezvous's own rule (a JOIN with another id is refused), checked before anything
    // (a log directory, a store) is created.
    if (!rdzv::is_clean_name(o.rdzv_id, rdzv::kMaxRunIdLen, true)) {
      bad("rdzv_id", *s, "1-" + std::to_string(rdzv::kMaxRunIdLen) + " printable ASCII characters");
    }
  }
  if (auto s = get("rdzv_conf")) o.rdzv_conf = parse_rdzv_conf(*s);
  if (auto s = get("max_restarts")) {
    o.max_restarts = int_in("max_restarts", *s, 0, 1 << 20, "an integer >= 0");
  }
  if (auto s = get("monitor_interval")) o.monitor_interval = seconds("monitor_interval", *s);
  if (auto s = get("start_method")) {
    std::string m = trim(*s);
    if (m != "spawn" && m != "fork" && m != "forkserver") bad("start_method", *s, "spawn, fork or forkserver");
  }
  if (auto s = get("role")) {
    if (trim(*s).empty()) bad("role", *s, "a non-empty name");
    o.role = trim(*s);
  }
  if (auto s = get("log_dir")) o.log_dir = *s;
  if (auto s = get("redirects")) o.redirects = parse_std_streams("redirects", *s);
  if (auto s = get("tee")) o.tee = parse_std_streams("tee", *s);
  if (auto s = get("local_ranks_filter")) o.local_ranks_filter = parse_local_ranks_filter(*s);
  if (auto s = get("local_addr")) o.local_addr = trim(*s);
  if (auto s = get("rdzv_token_file")) {
    if (trim(*s).empty()) bad("rdzv_token_file", *s, "the path of a file holding the token");
    o.rdzv_token_file = *s;
  }
  if (auto s = get("signals_to_handle")) {
    o.signals_to_handle = parse_signals(*s);
    o.signals_to_handle_text = trim(*s);
  } else {
    o.signals_to_handle = parse_signals(o.signals_to_handle_text);
  }
  if (auto s = get("shutdown_timeout")) o.shutdown_timeout_s = seconds("shutdown_timeout", *s);
  if (auto s = get("preempt_signals")) {
    o.preempt_signals_text = trim(*s);
    o.preempt_signals = o.preempt_signals_text == "none" ? std::vector<int>{} : parse_signals(*s, "preempt_signals");
  } else {
    o.preempt_signals = parse_signals(o.preempt_signals_text, "preempt_signals");
  }
  if (auto s = get("preempt_grace")) o.preempt_grace_s = seconds("preempt_grace", *s);

  if (auto s = get("exit_barrier_timeout")) o.exit_barrier_timeout_s = seconds("exit_barrier_timeout", *s);
  if (auto s = get("overlap_restart")) o.overlap_restart = boolean("overlap_restart", *s);
  if (auto s = get("early_exit_watch")) o.early_exit_watch = boolean("early_exit_watch", *s);
  if (auto s = get("warm_spares")) o.warm_spares = boolean("warm_spares", *s);
  if (auto s = get("preload")) {
    o.preload.clear();
    for (const auto& m : split(*s, ',')) {
      if (m.empty()) continue;
      bool ok = true;
      for (const auto& part : split(m, '.'))
        ok = ok && !part.empty() && !std::isdigit(static_cast<unsigned char>(part[0])) &&
             std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isalnum(c) || c == '_'; });
      if (!ok) bad("preload", *s, "Python module names separated by commas, e.g. torch,torch.distributed");
      o.preload.push_back(m);
    }
  }
  if (auto s = get("spare_priority")) {
    const std::string p = trim(*s);
    if (p != "idle" && p != "normal") bad("spare_priority", *s, "idle or normal");
    o.spare_priority = p;
  }
  if (auto s = get("duplicate_stdout_filters")) o.duplicate_stdout_filters = parse_filter_list(*s);
  if (auto s = get("duplicate_stderr_filters")) o.duplicate_stderr_filters = parse_filter_list(*s);
  if (auto s = get("logs_specs")) {
    o.logs_specs = trim(*s);
    o.warnings.push_back("--logs_specs=" + o.logs_specs +
                         ": ddprun cannot load Python torchrun.logs_specs plugins; logs keep ddprun's default "
                         "layout (<log_dir>/<run_id>_<unique>/attempt_<n>/<local_rank>/)");
  }
  if (auto s = get("event_log_handler")) {
    std::string h = trim(*s);
    if (h != "null" && h != "console" && h != "dynamic_rendezvous") {
      bad("event_log_handler", *s, "null, console or dynamic_rendezvous (torchrun's registered handlers)");
    }
    o.event_log_handler = h;
    if (h == "console") {
      o.warnings.push_back("--event_log_handler=console: ddprun records no torchelastic events; its start line, "
                           "restart notices and failure summary on stderr say what happened");
    }
  }
  if (auto s = get("numa_binding")) {
    std::string m = trim(*s);
    if (!parse_numa_mode(m)) bad("numa_binding", *s, kNumaModeChoices);
    o.numa_binding = m;
  }

  if (o.standalone) {
    // torchrun: c10d on a free local port with a random run id, one node.
    if (get("nnodes") && o.max_nodes != 1) {
      throw UsageError("--standalone runs one node; --nnodes must be 1");
    }
    o.rdzv_backend = "c10d";
    o.rdzv_host = "localhost";
    o.rdzv_port = 0;
    o.rdzv_port_given = true;
    o.rdzv_id = random_run_id();
    o.min_nodes = o.max_nodes = 1;
  }
  if (o.node_rank >= o.max_nodes) {
    throw UsageError("--node_rank=" + std::to_string(o.node_rank) + " must be below --nnodes (" +
                     std::to_string(o.max_nodes) + ")");
  }
  if (o.max_nodes > 1) {
    if (o.rdzv_backend == "static" && o.min_nodes != o.max_nodes) {
      throw UsageError("--nnodes=" + *get("nnodes") +
                       ": an elastic MIN:MAX range needs --rdzv_backend=c10d with --rdzv_endpoint=HOST:PORT; "
                       "static rendezvous takes a fixed --nnodes=N");
    }
    if (o.rdzv_backend == "c10d" && o.rdzv_host.empty()) {
      throw UsageError("--rdzv_backend=c10d with --nnodes=" + *get("nnodes") +
                       " needs --rdzv_endpoint=HOST[:PORT] (an address every node can reach)");
    }
    if (o.rdzv_backend == "c10d" && get("node_rank")) {
      throw UsageError("--node_rank applies to --rdzv_backend=static only; with c10d the rendezvous assigns "
                       "node ranks (the endpoint's host gets 0). Drop --node_rank, or use static rendezvous");
    }
  }
  return o;
}

ParseOutcome parse_command_line(const std::vector<std::string>& argv, const EnvMap& env,
                                const SystemInfo& sys) {
  ParseOutcome out;
  RawOptions raw;
  CLI::App app{"ddprun", "ddprun"};
  setup_options(app, raw);
  try {
    std::vector<std::string> args(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
    check_empty_values(args);
    std::reverse(args.begin(), args.end());  // CLI11 consumes from the back
    app.parse(args);
    raw.rest = app.remaining();
    if (!raw.rest.empty() && raw.rest.front() == "--") raw.rest.erase(raw.rest.begin());
    out.options = finalize_options(raw, env, sys);
  } catch (const CLI::CallForHelp&) {
    out.message = app.help();
    out.exit_code = 0;
  } catch (const CLI::ParseError& e) {
    out.message = e.what();
    out.exit_code = kUsageExitCode;
  } catch (const UsageError& e) {
    out.message = e.what();
    out.exit_code = kUsageExitCode;
  }
  // Errors quote the user's flags and values: keep them one line, and let no control byte
  // (newline, terminal escape) through to the console (found by tests/fuzz, options target).
  if (out.exit_code == kUsageExitCode) {
    for (char& c : out.message) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = c == '\n' ? ' ' : '?';
    }
  }
  return out;
}

}  // namespace ddprun::launcher
