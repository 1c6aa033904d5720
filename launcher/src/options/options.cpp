#include "ddprun/launcher/options.h"

#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <random>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/numa.h"
#include "ddprun/launcher/slurm.h"
#include "options/flags.h"
#include "bash_completion.h"
#include "options/values.h"
#include "ddprun/rdzv/validate.h"

extern char** environ;

namespace ddprun::launcher {

using namespace opt;

namespace {

// --print_completion SHELL (torchrun 2.15's flag): the script for bash; zsh and tcsh, which
// torchrun also offers, are refused with what to do instead.
std::string completion_script(const std::string& shell) {
  if (trim(shell) == "bash") return generated::kBashCompletion;
  if (trim(shell) == "zsh" || trim(shell) == "tcsh")
    throw UsageError("--print_completion=" + shell +
                     ": ddprun has a bash completion only; give "
                     "--print_completion=bash (torchrun's zsh and tcsh scripts are not made)");
  throw UsageError("--print_completion=" + shell + ": give bash");
}

std::string random_run_id() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()));
  static const char hex[] = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 32; ++i) {
    id.push_back(hex[gen() & 15]);
    if (i == 7 || i == 11 || i == 15 || i == 19) id.push_back('-');
  }
  return id;
}

// The given flags after PET_<FLAG> (the command line wins) and Slurm's defaults (slurm.h).
struct Given {
  std::map<std::string, std::string> v;
  const std::string* get(const char* name) const {
    auto it = v.find(name);
    return it == v.end() ? nullptr : &it->second;
  }
};

Given gather(const RawOptions& raw, const EnvMap& env, SystemInfo& host, LaunchOptions& o) {
  Given g{raw.given};
  for (const auto& f : all_flags()) {
    if (g.v.count(f.name)) continue;
    auto it = env.find(env_name(f.name));
    if (it != env.end()) {
      if (!f.takes_value && !truthy(f.name, it->second)) continue;
      g.v[f.name] = f.takes_value ? it->second : "1";
    }
  }
  // torchrun's default for these is empty, or an empty value means "not given" there: the
  // flag is left out (and Slurm may supply it, below). The other flags' empty values are taken
  // up where they are parsed.
  for (const char* name :
       {"rdzv_endpoint", "rdzv_conf", "log_dir", "local_addr", "local_ranks_filter", "log_line_prefix_template"}) {
    if (auto it = g.v.find(name); it != g.v.end() && it->second.empty()) g.v.erase(it);
  }
  // torchrun's own variables for two flags it reads there when the flag is not given.
  for (const auto& [flag, var] : {std::pair{"log_line_prefix_template", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"},
                                  std::pair{"shutdown_timeout", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}}) {
    auto it = env.find(var);
    if (it != env.end() && !it->second.empty()) g.v.emplace(flag, it->second);
  }
  // Inside an srun step, Slurm's environment supplies the flags still missing.
  if (!g.v.count("no_slurm")) {
    SlurmDerivation slurm = derive_from_slurm(env, g.v);
    for (const auto& [flag, value] : slurm.flags) g.v.emplace(flag, value);
    if (slurm.gpu_count) host.gpu_count = *slurm.gpu_count;
    o.platform.slurm_summary = slurm.summary;
    o.warnings = slurm.warnings;
  }
  return g;
}

void entry_point(const Given& g, const RawOptions& raw, LaunchOptions& o) {
  if (raw.rest.empty()) {
    throw UsageError("missing entry point: expected `ddprun [options] script.py|program [args...]`");
  }
  if (!raw.rest[0].empty() && raw.rest[0][0] == '-') {
    throw UsageError("unrecognized flag '" + raw.rest[0] + "'; see ddprun --help for the accepted flags");
  }
  o.workers.entrypoint = raw.rest[0];
  o.workers.args.assign(raw.rest.begin() + 1, raw.rest.end());
  o.workers.module = g.get("module") != nullptr;
  o.workers.no_python = g.get("no_python") != nullptr;
  o.workers.run_path = g.get("run_path") != nullptr;
  if (int(o.workers.module) + int(o.workers.no_python) + int(o.workers.run_path) > 1) {
    throw UsageError("--module, --no_python and --run_path are mutually exclusive");
  }
}

// Nodes, ranks, the store and the rendezvous.
void topology(const Given& g, const SystemInfo& host, LaunchOptions& o) {
  if (auto s = g.get("nproc_per_node")) o.nodes.nproc_per_node = parse_nproc_per_node(*s, host);
  if (auto s = g.get("nnodes")) std::tie(o.nodes.min_nodes, o.nodes.max_nodes) = parse_nnodes(*s);
  if (auto s = g.get("node_rank")) o.nodes.node_rank = int_in("node_rank", *s, 0, 1 << 20, "an integer >= 0");
  if (auto s = g.get("master_addr")) {
    if (trim(*s).empty()) bad("master_addr", *s, "a host name or address");
    o.rendezvous.master_addr = trim(*s);
  }
  if (auto s = g.get("master_port")) {
    o.rendezvous.master_port =
        static_cast<uint16_t>(int_in("master_port", *s, 0, 65535, "a port 0-65535 (0 = a free port)"));
  }
  if (auto s = g.get("rdzv_backend")) {
    std::string b = trim(*s);
    if (b == "etcd" || b == "etcd-v2") {
      throw UsageError("--rdzv_backend=" + b + ": not supported by ddprun; expected static or c10d");
    }
    if (b != "static" && b != "c10d") bad("rdzv_backend", *s, "static or c10d");
    o.rendezvous.backend = b == "c10d" ? RdzvBackend::C10d : RdzvBackend::Static;
  }
  if (auto s = g.get("rdzv_endpoint")) {
    o.rendezvous.endpoint = trim(*s);
    HostPort hp = parse_host_port("rdzv_endpoint", *s);
    o.rendezvous.host = hp.host;
    if (hp.port) {
      o.rendezvous.port = *hp.port;
      o.rendezvous.port_given = true;
    }
  }
  if (auto s = g.get("rdzv_id")) {
    // Empty: a random id, as torchrun draws one (its default is "none", an id like any other).
    o.rendezvous.id = trim(*s).empty() ? random_run_id() : trim(*s);
    if (trim(*s).empty() && o.nodes.max_nodes > 1)
      o.warnings.push_back("--rdzv_id= (empty): this node runs as job " + o.rendezvous.id +
                           ", a random id of its own, as torchrun; nodes with other ids never join it: give every "
                           "node the same --rdzv_id");
    // The rendezvous's own rule (a JOIN with another id is refused), checked before anything
    // (a log directory, a store) is created.
    if (!rdzv::is_clean_name(o.rendezvous.id, rdzv::kMaxRunIdLen, true)) {
      bad("rdzv_id", *s, "1-" + std::to_string(rdzv::kMaxRunIdLen) + " printable ASCII characters");
    }
  }
  if (auto s = g.get("rdzv_conf")) o.rendezvous.conf = parse_rdzv_conf(*s);
  if (auto s = g.get("local_addr")) o.rendezvous.local_addr = trim(*s);
  if (auto s = g.get("store_relay")) {
    const std::string v = trim(*s);
    if (v == "auto") o.rendezvous.store_relay = StoreRelayMode::Auto;
    else if (v == "on") o.rendezvous.store_relay = StoreRelayMode::On;
    else if (v == "off") o.rendezvous.store_relay = StoreRelayMode::Off;
    else bad("store_relay", *s, "auto, on or off");
  }
  if (auto s = g.get("rdzv_token_file")) {
    if (trim(*s).empty()) bad("rdzv_token_file", *s, "the path of a file holding the token");
    o.rendezvous.token_file = *s;
  }
  o.rendezvous.standalone = g.get("standalone") != nullptr;
}

// Restarts, signals and stopping.
void lifecycle(const Given& g, LaunchOptions& o) {
  if (auto s = g.get("max_restarts")) {
    o.faults.max_restarts = int_in("max_restarts", *s, 0, 1 << 20, "an integer >= 0");
  }
  o.faults.retry_deterministic = g.get("retry_deterministic") != nullptr;
  if (auto s = g.get("monitor_interval")) o.faults.monitor_interval = seconds("monitor_interval", *s);
  if (auto s = g.get("start_method")) {
    std::string m = trim(*s);
    if (m != "spawn" && m != "fork" && m != "forkserver") bad("start_method", *s, "spawn, fork or forkserver");
  }
  if (auto s = g.get("signals_to_handle"); s && trim(*s).empty()) {
    // torchrun then handles no signal, and its workers find the variable empty.
    o.faults.signals_to_handle.clear();
    o.faults.signals_to_handle_text.clear();
    o.warnings.push_back("--signals_to_handle= (empty): ddprun handles no signal, as torchrun: SIGTERM, SIGINT, SIGHUP "
                         "or SIGQUIT ends it at once, its workers with it (SIGKILL), without a summary");
  } else if (s) {
    o.faults.signals_to_handle = parse_signals(*s);
    o.faults.signals_to_handle_text = trim(*s);
  } else {
    o.faults.signals_to_handle = parse_signals(o.faults.signals_to_handle_text);
  }
  if (auto s = g.get("shutdown_timeout")) o.faults.shutdown_timeout_s = seconds("shutdown_timeout", *s);
  if (auto s = g.get("preempt_signals")) {
    o.faults.preempt_signals_text = trim(*s);
    o.faults.preempt_signals =
        o.faults.preempt_signals_text == "none" ? std::vector<int>{} : parse_signals(*s, "preempt_signals");
  } else {
    o.faults.preempt_signals = parse_signals(o.faults.preempt_signals_text, "preempt_signals");
  }
  if (auto s = g.get("preempt_grace")) o.faults.preempt_grace_s = seconds("preempt_grace", *s);
  if (auto s = g.get("exit_barrier_timeout")) o.faults.exit_barrier_timeout_s = seconds("exit_barrier_timeout", *s);
  if (auto s = g.get("hang_timeout")) {
    o.faults.hang_timeout_s = seconds("hang_timeout", *s);
    if (o.faults.hang_timeout_s > 0 && o.faults.hang_timeout_s < 1)
      bad("hang_timeout", *s, "0 (off) or a number of seconds >= 1");
  }
  o.faults.nccl_flight_recorder = g.get("nccl_flight_recorder") != nullptr;
  if (auto s = g.get("overlap_restart")) o.faults.overlap_restart = boolean("overlap_restart", *s);
  if (auto s = g.get("early_exit_watch")) o.workers.early_exit_watch = boolean("early_exit_watch", *s);
}

// What each worker is started as and where its output goes.
void workers(const Given& g, LaunchOptions& o) {
  o.workers.virtual_local_rank = g.get("virtual_local_rank") != nullptr;
  o.output.verbosity = g.get("verbose") ? 1 : 0;
  o.output.log_timestamps = g.get("log_timestamps") != nullptr;
  if (auto s = g.get("gpu_util_warn")) {
    char* end = nullptr;
    const std::string v = trim(*s);
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(d >= 0 && d <= 1))
      bad("gpu_util_warn", *s, "a fraction from 0 to 1, e.g. 0.85 (0 = never warn)");
    o.output.gpu_util_warn = d;
  }
  if (auto s = g.get("log_format")) {
    auto f = parse_log_format(trim(*s));
    if (!f) bad("log_format", *s, "text or json");
    o.output.log_format = *f;
  }
  if (auto s = g.get("role")) o.workers.role = trim(*s);  // empty: ROLE_NAME is empty, as under torchrun
  if (auto s = g.get("log_dir")) o.output.log_dir = *s;
  if (auto s = g.get("redirects")) o.output.redirects = parse_std_streams("redirects", *s);
  if (auto s = g.get("tee")) o.output.tee = parse_std_streams("tee", *s);
  if (auto s = g.get("local_ranks_filter")) o.output.local_ranks_filter = parse_local_ranks_filter(*s);
  o.output.no_prefix = g.get("no_prefix") != nullptr;
  if (auto s = g.get("log_line_prefix_template")) o.output.line_prefix = {*s, o.workers.role};
  if (auto s = g.get("stdin_rank")) {
    if (trim(*s) == "none") {
      o.output.stdin_rank = OutputOptions::kNoStdinRank;
    } else {
      const auto r = to_int(trim(*s));
      if (!r || *r < 0 || *r > (1 << 20)) bad("stdin_rank", *s, "a global rank (0, 1, ...) or none");
      o.output.stdin_rank = static_cast<int>(*r);
    }
  }
  if (auto s = g.get("duplicate_stdout_filters")) o.output.duplicate_stdout_filters = parse_filter_list(*s);
  if (auto s = g.get("duplicate_stderr_filters")) o.output.duplicate_stderr_filters = parse_filter_list(*s);
  if (auto s = g.get("metrics_port"))
    o.output.metrics_port =
        static_cast<uint16_t>(int_in("metrics_port", *s, 0, 65535, "a port 0-65535 (0 = a free port)"));
  if (auto s = g.get("metrics_host")) {
    if (trim(*s).empty()) bad("metrics_host", *s, "an address of this host, e.g. 127.0.0.1");
    o.output.metrics_host = trim(*s);
    if (!o.output.metrics_port)
      o.warnings.push_back("--metrics_host without --metrics_port: no metrics endpoint (give --metrics_port=PORT, "
                           "0 for a free one)");
  }
  o.platform.no_preflight = g.get("no_preflight") != nullptr;
  if (auto s = g.get("numa_binding")) {
    o.platform.numa_binding = parse_numa_mode(trim(*s));
    if (!o.platform.numa_binding) bad("numa_binding", *s, kNumaModeChoices);
  }
}

void spares(const Given& g, LaunchOptions& o) {
  if (auto s = g.get("warm_spares")) o.spares.enabled = boolean("warm_spares", *s);
  if (auto s = g.get("preload")) {
    o.spares.preload.clear();
    for (const auto& m : split(*s, ',')) {
      if (m.empty()) continue;
      bool ok = true;
      for (const auto& part : split(m, '.'))
        ok = ok && !part.empty() && !std::isdigit(static_cast<unsigned char>(part[0])) &&
             std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isalnum(c) || c == '_'; });
      if (!ok) bad("preload", *s, "Python module names separated by commas, e.g. torch,torch.distributed");
      o.spares.preload.push_back(m);
    }
  }
  if (auto s = g.get("spare_cuda")) o.spares.cuda = boolean("spare_cuda", *s);
  if (auto s = g.get("spare_priority")) {
    const std::string p = trim(*s);
    if (p != "idle" && p != "normal") bad("spare_priority", *s, "idle or normal");
    o.spares.priority = p == "idle" ? SparePriority::Idle : SparePriority::Normal;
  }
}

// torchrun flags ddprun accepts with a warning about what they mean here.
void compatibility(const Given& g, LaunchOptions& o) {
  if (auto s = g.get("logs_specs")) {
    o.output.logs_specs = trim(*s);
    o.warnings.push_back("--logs_specs=" + o.output.logs_specs +
                         ": ddprun cannot load Python torchrun.logs_specs plugins; logs keep ddprun's default "
                         "layout (<log_dir>/<run_id>_<unique>/attempt_<n>/<local_rank>/)");
  }
  if (auto s = g.get("event_log_handler")) {
    std::string h = trim(*s);
    if (h != "null" && h != "console" && h != "dynamic_rendezvous") {
      bad("event_log_handler", *s, "null, console or dynamic_rendezvous (torchrun's registered handlers)");
    }
    o.output.event_log_handler = h == "console"              ? EventLogHandler::Console
                                 : h == "dynamic_rendezvous" ? EventLogHandler::DynamicRendezvous
                                                             : EventLogHandler::Null;
    if (h == "console") {
      o.warnings.push_back("--event_log_handler=console: ddprun records no torchelastic events; its start line, "
                           "restart notices and failure summary on stderr say what happened");
    }
  }
}

// --standalone, and the combinations that cannot work.
void cross_checks(const Given& g, LaunchOptions& o) {
  if (o.rendezvous.standalone) {
    // torchrun: c10d on a free local port with a random run id, one node.
    if (g.get("nnodes") && o.nodes.max_nodes != 1) {
      throw UsageError("--standalone runs one node; --nnodes must be 1");
    }
    o.rendezvous.backend = RdzvBackend::C10d;
    o.rendezvous.host = "localhost";
    o.rendezvous.port = 0;
    o.rendezvous.port_given = true;
    o.rendezvous.id = random_run_id();
    o.nodes.min_nodes = o.nodes.max_nodes = 1;
  }
  if (o.nodes.node_rank >= o.nodes.max_nodes) {
    throw UsageError("--node_rank=" + std::to_string(o.nodes.node_rank) + " must be below --nnodes (" +
                     std::to_string(o.nodes.max_nodes) + ")");
  }
  if (o.nodes.max_nodes > 1) {
    if (o.rendezvous.backend == RdzvBackend::Static && o.nodes.min_nodes != o.nodes.max_nodes) {
      throw UsageError("--nnodes=" + *g.get("nnodes") +
                       ": an elastic MIN:MAX range needs --rdzv_backend=c10d with --rdzv_endpoint=HOST:PORT; "
                       "static rendezvous takes a fixed --nnodes=N");
    }
    if (o.rendezvous.backend == RdzvBackend::C10d && o.rendezvous.host.empty()) {
      throw UsageError("--rdzv_backend=c10d with --nnodes=" + *g.get("nnodes") +
                       " needs --rdzv_endpoint=HOST[:PORT] (an address every node can reach)");
    }
    if (o.rendezvous.backend == RdzvBackend::C10d && g.get("node_rank")) {
      throw UsageError("--node_rank applies to --rdzv_backend=static only; with c10d the rendezvous assigns "
                       "node ranks (the endpoint's host gets 0). Drop --node_rank, or use static rendezvous");
    }
  }
}

}  // namespace

const char* rdzv_backend_name(RdzvBackend backend) { return backend == RdzvBackend::C10d ? "c10d" : "static"; }

const char* spare_priority_name(SparePriority priority) { return priority == SparePriority::Idle ? "idle" : "normal"; }

bool OutputOptions::any_files(int nproc) const {
  for (int r = 0; r < nproc; ++r)
    if ((redirects.for_rank(r) | tee.for_rank(r)) != 0) return true;
  return false;
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

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    env.emplace(std::string(const_cast<const char*>(*e), eq), std::string(eq + 1));
  }
  return env;
}

LaunchOptions finalize_options(const RawOptions& raw, const EnvMap& env, const SystemInfo& sys) {
  LaunchOptions o;
  SystemInfo host = sys;
  const Given g = gather(raw, env, host, o);
  entry_point(g, raw, o);
  topology(g, host, o);
  lifecycle(g, o);
  workers(g, o);
  spares(g, o);
  compatibility(g, o);
  cross_checks(g, o);
  return o;
}

ParseOutcome parse_command_line(const std::vector<std::string>& argv, const EnvMap& env, const SystemInfo& sys) {
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
    if (auto it = raw.given.find("print_completion"); it != raw.given.end()) {
      out.message = completion_script(it->second);
      out.exit_code = 0;
      return out;
    }
    out.options = finalize_options(raw, env, sys);
  } catch (const CLI::CallForHelp&) {
    out.message = app.help();
    out.exit_code = 0;
  } catch (const CLI::CallForVersion& e) {
    out.message = std::string(e.what()) + "\n";
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
