#include "options/flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/options.h"

#ifndef DDPRUN_VERSION  // set by the build (cmake/Packaging.cmake) from the project's version
#define DDPRUN_VERSION "unknown"
#endif

namespace ddprun::launcher {
namespace opt {
namespace {

constexpr FlagSpec kFlags[] = {
    {"nproc_per_node", "", true, "workers on this node: an int, cpu, gpu or auto (default 1)"},
    {"nnodes", "", true, "number of nodes, N or MIN:MAX (elastic, c10d only; default 1)"},
    {"node_rank", "", true, "rank of this node, static rendezvous only (default 0)"},
    {"master_addr", "", true, "address of the store the workers use (default 127.0.0.1)"},
    {"master_port", "", true, "port of the store (default 29500, or a free port when 29500 is taken; 0 = a free port)"},
    {"rdzv_backend", "", true, "static (default) or c10d"},
    {"rdzv_endpoint", "", true, "host[:port] of the rendezvous (default port 29400)"},
    {"rdzv_id", "", true, "job id shared by every node (default none)"},
    {"rdzv_conf", "", true,
     "k=v,... (join_timeout, last_call_timeout, close_timeout, "
     "read_timeout, is_host, ...)"},
    {"standalone", "", false, "single node, store on a free local port, random run id"},
    {"max_restarts", "", true, "restarts of the local worker group on failure (default 0)"},
    {"retry_deterministic", "", false,
     "spend restarts on a failure that repeats the same way within 2 s before the workers joined "
     "their store (an import error; by default the job ends at the second one)"},
    {"monitor_interval", "", true,
     "accepted for torchrun compatibility and unused: ddprun never polls, it learns of a "
     "worker's exit at once"},
    {"start_method", "", true,
     "accepted for torchrun compatibility (spawn, fork, forkserver); "
     "ddprun always fork/execs"},
    {"role", "", true, "role of the workers (default 'default')"},
    {"module", "m", false, "run the entry point as a Python module (python -u -m ...)"},
    {"no_python", "", false, "run the entry point as a program, without Python"},
    {"run_path", "", false, "run the entry point with runpy.run_path"},
    {"log_dir", "", true,
     "directory for per-rank logs <log_dir>/<run_id>_<unique>/attempt_<n>/<rank>/ (a new <unique> every launch; a "
     "later round of the same attempt, after a scale-up: attempt_<n>.<k>/)"},
    {"redirects", "r", true, "streams to redirect to log files only: 0-3 or 0:3,1:0 per rank"},
    {"tee", "t", true, "streams to write to console and log files: 0-3 or 0:3,1:0 per rank"},
    {"log_line_prefix_template", "", true,
     "the prefix of each worker line on the console, a template of ${rank}, ${local_rank}, "
     "${role_name} and ${hostname} ($$ is a $), e.g. '${hostname}:${rank}: ' (as torchrun 2.15; "
     "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE when not given); default [r3]: or [n1 r3]:"},
    {"local_ranks_filter", "", true, "only these local ranks print to the console, e.g. 0,2"},
    {"no_prefix", "", false,
     "show the workers' output without the rank prefix ([r3]: one node, [n1 r3]: across nodes)"},
    {"stdin_rank", "", true,
     "the global rank that reads ddprun's stdin (the others get /dev/null), so breakpoint() and pdb "
     "work there; none: no rank. Default: rank 0 when stdin is a terminal, otherwise every worker "
     "inherits it (as under torchrun)"},
    {"local_addr", "", true, "address this node advertises"},
    {"rdzv_token_file", "", true,
     "a file (mode 0600, yours) holding the rendezvous token, a shared secret of 16+ bytes: agents "
     "must prove they hold it (HMAC challenge-response, both ways) to join a multi-node job; the "
     "same on every node and on a standing ddprund. Without it, DDPRUN_RDZV_TOKEN; without "
     "either the rendezvous is open to anyone who can reach it"},
    {"store_relay", "", true,
     "auto (default), on or off: each node's workers reach their store through a relay on their "
     "node (MASTER_ADDR=127.0.0.1, MASTER_PORT=its port), so the store holds one connection per node "
     "instead of one per worker. auto: for rounds of 64 nodes or more; never for one node"},
    {"signals_to_handle", "", true, "signals forwarded to the workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)"},
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
    {"hang_timeout", "", true,
     "seconds a worker's progress counter may stand still before it counts as hung (libddprun_worker "
     "ticks every step; Python: `import ddprun; ddprun.progress()`); ddprun then names the stuck "
     "ranks, saves every local rank's stack (py-spy, else eu-stack or gdb) in the run's log directory "
     "and restarts the group as after a failure (--max_restarts). 0 (default): off"},
    {"nccl_flight_recorder", "", false,
     "set PyTorch's NCCL flight recorder on (TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, "
     "TORCH_NCCL_DEBUG_INFO_TEMP_FILE) with its dumps in <run dir>/nccl_trace/; the summary lists them"},
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
    {"preload", "", true,
     "modules a warm spare imports before it waits, comma-separated "
     "(default torch,torch.distributed)"},
    {"spare_priority", "", true,
     "idle (default): spares import at SCHED_IDLE priority, on CPU time the job leaves unused (a preload that starts "
     "threads or needs the main thread is imported again at normal priority); "
     "normal: at the workers' priority (spares are ready sooner on a busy host)"},
    {"spare_cuda", "", true,
     "1: a warm spare also creates the CUDA context of its local rank's GPU (device LOCAL_RANK) and "
     "pays NCCL's one-time set-up (a one-rank communicator, destroyed), so a restart's worker reaches "
     "its first NCCL all_reduce sooner; each spare holds that context's GPU memory; refused on GPUs "
     "in an exclusive compute mode; 0 (default): spares touch no GPU"},
    {"virtual_local_rank", "", false,
     "each worker sees only its own GPU as device 0 (LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=its GPU)"},
    {"duplicate_stdout_filters", "", true,
     "copy the tee'd stdout lines that contain any of these strings (comma-separated, ',,' is a "
     "comma) to <log dir>/<run>/attempt_<n>/filtered_stdout.log"},
    {"duplicate_stderr_filters", "", true, "the same for stderr: filtered_stderr.log"},
    {"logs_specs", "", true,
     "accepted for torchrun compatibility: names a Python torchrun.logs_specs plugin, which ddprun "
     "cannot load; it keeps its default log layout and warns"},
    {"event_log_handler", "", true,
     "accepted for torchrun compatibility: null (default), console or dynamic_rendezvous; ddprun "
     "records no torchelastic events (console warns)"},
    {"numa_binding", "", true,
     "bind each local rank to the CPUs near the GPU whose index is its local rank: node, socket, "
     "exclusive or core-complex (as torchrun 2.11; needs NVIDIA GPUs)"},
    {"metrics_port", "", true,
     "serve Prometheus metrics (workers by state, restarts, failures, rendezvous time, each rank's CPU "
     "and memory) at http://HOST:PORT/metrics; 0 picks a free port, logged at start"},
    {"metrics_host", "", true,
     "address the metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 = every "
     "IPv4 address of this host)"},
    {"log_format", "", true,
     "text (default) or json: ddprun's own lines on stderr as JSON lines (time, level, host, node, "
     "rank, event, message, fields; launcher/README.md \"JSON logs\"); workers' output is unchanged"},
    {"log_timestamps", "", false,
     "text logs: begin each of ddprun's own lines with the local time (2026-12-06 12:14:47.123); "
     "off by default (JSON lines always carry a time)"},
    {"gpu_util_warn", "", true,
     "at the end, warn about ranks whose mean GPU utilisation (sampled while they ran) stayed below "
     "this fraction (default 0.85; 0 = never); only ranks whose GPU was sampled for 60 s or more"},
    {"no_slurm", "", false,
     "do not derive --nnodes, --node_rank, the rendezvous host, --rdzv_id and --nproc_per_node "
     "from the SLURM_* environment of an srun step"},
    {"print_completion", "", true,
     "print ddprun's bash completion script and exit (bash; zsh and tcsh, which torchrun 2.15 also "
     "names, are refused: in zsh, load it with bashcompinit)"},
    {"no_preflight", "", false,
     "skip the quick checks before the launch (GPUs against --nproc_per_node, /dev/shm, a loopback "
     "rendezvous host, the token file's mode; `ddprun doctor` runs them all)"},
};

std::string dashed(std::string s) {
  for (char& c : s) {
    if (c == '_') c = '-';
  }
  return s;
}

}  // namespace

std::span<const FlagSpec> all_flags() { return kFlags; }

std::string env_name(const std::string& name) {
  std::string out = "PET_";
  for (unsigned char c : name) out.push_back(static_cast<char>(std::toupper(c)));
  return out;
}

const FlagSpec* find_flag(const std::string& name) {
  for (const auto& f : kFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// An empty `--flag=` would make CLI11 take the next argument as the value (`--log_dir= x.py`
// ran with log_dir "x.py"). torchrun 2.11 runs with these flags empty (argparse passes "" on);
// the others it refuses (int(""), choices) or fails on later (an empty backend, host or
// handler name), and so does ddprun, here.
bool empty_value_allowed(const std::string& name) {
  static constexpr const char* kAllowed[] = {"rdzv_endpoint",
                                             "rdzv_id",
                                             "rdzv_conf",
                                             "role",
                                             "log_dir",
                                             "local_ranks_filter",
                                             "local_addr",
                                             "signals_to_handle",
                                             "log_line_prefix_template",
                                             "duplicate_stdout_filters",
                                             "duplicate_stderr_filters"};
  return std::find(std::begin(kAllowed), std::end(kAllowed), name) != std::end(kAllowed);
}

// Scans only ddprun's own flags, up to the entry point.
void check_empty_values(std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--" || a.size() < 2 || a[0] != '-') return;  // the entry point
    if (a[1] != '-') {                                     // -r 3, -t 3 take a value; -m, -v do not
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
    if (empty_value_allowed(name)) {
      args[i] = a.substr(0, eq);
      args.insert(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, "");
      ++i;
      continue;
    }
    throw UsageError(a + ": an empty value; give --" + f->name + "=VALUE, or leave the flag out (its default)");
  }
}

}  // namespace opt

using namespace opt;

void setup_options(CLI::App& app, RawOptions& raw) {
  app.prefix_command();
  app.description("ddprun: a torchrun-compatible launcher.\n"
                  "  ddprun [options] script.py|program [args...]\n"
                  "  ddprun doctor [--json] [options] [script.py|program [args...]]   check this node for that "
                  "launch (GPUs, versions, /dev/shm, network, token, Python) and start nothing\n"
                  "  ddprun status [--json] [--watch]   the running jobs of this user on this host, one row per "
                  "worker (ddprun status --help)\n"
                  "  ddprun dump [RUN]   print and save the stack of every worker of a running job (RUN: its log "
                  "directory or run id; none: the newest running job of yours on this host), stopping nothing\n"
                  "Every flag is accepted as --under_score and --dash-ed, and from PET_<FLAG> (the command "
                  "line wins). A .py entry point runs as $PYTHON_EXEC -u script.py (PYTHON_EXEC unset: "
                  "$DDPRUN_DEFAULT_PYTHON, which the pip-installed ddprun sets to its own Python, else "
                  "python3 from PATH).");
  app.footer(std::string(kExitCodeHelp) + "\n\nEnvironment knobs of ddprun itself:\n" + knobs::describe_all());
  for (const auto& f : opt::all_flags()) {
    std::string names;
    if (*f.short_name) names += std::string("-") + f.short_name + ",";
    names += std::string("--") + f.name;
    if (dashed(f.name) != f.name) names += ",--" + dashed(f.name);
    std::string name = f.name;
    std::string help = std::string(f.help) + " [env " + opt::env_name(f.name) + "]";
    if (f.takes_value) {
      app.add_option_function<std::string>(
          names, [&raw, name](const std::string& v) { raw.given[name] = v; }, help);
    } else {
      app.add_flag_callback(
          names, [&raw, name]() { raw.given[name] = "1"; }, help);
    }
  }
  app.add_flag_callback(
      "-v,--verbose", [&raw]() { raw.given["verbose"] = "1"; }, "debug logs from the agent");
  app.set_version_flag("--version", std::string("ddprun ") + DDPRUN_VERSION, "print ddprun's version and exit");
}

}  // namespace ddprun::launcher
