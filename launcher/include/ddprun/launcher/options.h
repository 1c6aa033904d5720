// ddprun's command line: torchrun's flags (both `--under_score` and `--dash-ed` spellings),
// each also from a `PET_<FLAG>` environment variable (the command line wins).
//
// Two steps, both pure:
//   1. setup_options(app, raw) binds every flag to a string in RawOptions (CLI11 prefix-command
//      mode: `ddprun [opts] entrypoint args...`);
//   2. finalize_options(raw, env, sys) fills the environment fallbacks, validates every value
//      and returns typed LaunchOptions (one section per concern), or throws UsageError with a one-line message naming
//      the flag and its accepted forms.
// parse_command_line() runs both and is what main() and the tests call.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"
#include "ddprun/launcher/log_format.h"
#include "ddprun/launcher/numa.h"

namespace CLI {
class App;
}

namespace ddprun::launcher {

// Bad command line input. The message is one line, names the flag and the accepted forms.
// main() prints it and exits with kUsageExitCode; nothing has been started.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kUsageExitCode = 2;
// The workers succeeded but some of their output could not be written to its log files (a
// full disk, an I/O error): sysexits' EX_IOERR. A run that failed keeps its own code.
inline constexpr int kLogsLostExitCode = 74;
// --exit_barrier_timeout expired: a worker had exited 0 and the others were stopped (the code
// of timeout(1)).
inline constexpr int kExitBarrierTimeoutExitCode = 124;
// The exit-code table of `ddprun --help` (and the README's).
inline constexpr const char* kExitCodeHelp =
    "Exit codes: 0 every worker succeeded; a failed worker's own exit code (1 when it had none, "
    "128+N when killed by signal N), also after the restarts are spent; 2 bad command line; "
    "128+N ddprun itself stopped by signal N; 74 the workers succeeded but log files lost output "
    "(full disk, I/O error: the console has it all, the summary lists the files); 124 "
    "--exit_barrier_timeout expired and the workers still running were stopped; 99 preempted: "
    "a --preempt_signals signal reached ddprun, or a worker wrote 'preempted' to its "
    "DDPRUN_PREEMPT_FILE and then exited 99 (not a failure, requeue the job). Any other worker "
    "exit 99 is an ordinary failure.";

// What the host offers, for `--nproc_per_node=cpu|gpu|auto`. probe_system() fills it from
// the machine (the launcher never links CUDA: GPUs are counted from CUDA_VISIBLE_DEVICES, or
// else /dev/nvidia[0-9]*).
struct SystemInfo {
  int cpu_count = 1;
  int gpu_count = 0;
};
SystemInfo probe_system(const EnvMap& env);
int count_visible_gpus(const EnvMap& env, int dev_nvidia_count);

// Which of a worker's streams go to a file (redirects) or to file and console (tee).
enum StdStreamMask : int { kStreamNone = 0, kStreamOut = 1, kStreamErr = 2, kStreamBoth = 3 };

// `-r/--redirects` and `-t/--tee`: one mask for every local rank ("3"), or per local rank
// ("0:3,1:0"; ranks not listed get 0).
struct StdStreamSpec {
  int all = kStreamNone;
  std::map<int, int> per_rank;
  int for_rank(int local_rank) const;
};

// The option sections: one struct per concern (CLI11's layout, PyTorch's TCPStoreOptions), each
// given only to the part that uses it. Values are validated and typed here; facts that need
// the machine (the token's file, the NUMA CPU sets, the worker command) are resolved once in
// the launch plan (launch_plan.h).

// --rdzv_backend: static (node 0 hosts, fixed --nnodes) or c10d (--rdzv_endpoint, elastic).
enum class RdzvBackend { Static, C10d };
const char* rdzv_backend_name(RdzvBackend backend);
// --spare_priority: a warm spare imports in a SCHED_IDLE thread, or at normal priority.
enum class SparePriority { Idle, Normal };
const char* spare_priority_name(SparePriority priority);
// --event_log_handler: torchrun's event sinks. ddprun records no torchelastic events.
enum class EventLogHandler { Null, Console, DynamicRendezvous };

// How many nodes and workers: --nproc_per_node, --nnodes, --node_rank.
struct NodeOptions {
  int nproc_per_node = 1;  // resolved worker count on this node
  int min_nodes = 1;
  int max_nodes = 1;
  int node_rank = 0;
  bool multi_node() const { return max_nodes > 1; }
};

// Where the job meets: the store and the rendezvous.
enum class StoreRelayMode { Auto, On, Off };
// Rounds of this many nodes and more get a store relay under --store_relay auto: below it the
// workers' direct connections cost the store little, and MASTER_ADDR stays the store's address.
inline constexpr int kStoreRelayAutoNodes = 64;
// Whether a round of `nnodes` nodes relays its workers' store connections (never one node).
inline bool store_relay_for(StoreRelayMode m, int nnodes) {
  return nnodes > 1 && (m == StoreRelayMode::On || (m == StoreRelayMode::Auto && nnodes >= kStoreRelayAutoNodes));
}

struct RendezvousOptions {
  RdzvBackend backend = RdzvBackend::Static;
  std::string master_addr = "127.0.0.1";
  // Unset: 29500, or a free port when 29500 is taken. Set (even 29500): exactly that port;
  // 0 asks for a free port.
  std::optional<uint16_t> master_port;
  std::string endpoint;  // --rdzv_endpoint host[:port], as given
  std::string host;
  uint16_t port = 29400;
  bool port_given = false;  // false: 29400, or a free port when it is taken
  std::string id = "none";
  std::map<std::string, std::string> conf;
  bool standalone = false;
  std::string local_addr;
  // --rdzv_token_file ("" = none given): the launch plan loads it, or DDPRUN_RDZV_TOKEN.
  std::string token_file;
  // --store_relay: whether a multi-node round's workers reach their store through a relay on
  // their own node (relay/store_relay.h), one connection per node (store_relay_for).
  StoreRelayMode store_relay = StoreRelayMode::Auto;
};

// What each worker is started as.
struct WorkerOptions {
  std::string entrypoint;
  std::vector<std::string> args;
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  bool virtual_local_rank = false;
  std::string role = "default";
  // A seccomp listener per worker that reports its exit as it begins (process.h); sets
  // no_new_privs on the workers when ddprun lacks CAP_SYS_ADMIN.
  bool early_exit_watch = true;
};

// Where the workers' output and ddprun's own logs go.
struct OutputOptions {
  std::string log_dir;  // empty: no log files (error files go to a temporary directory)
  StdStreamSpec redirects;
  StdStreamSpec tee;
  std::optional<std::set<int>> local_ranks_filter;  // unset: every local rank prints
  bool no_prefix = false;                           // --no_prefix: worker lines reach the console without "[r3]: "
  // --log_line_prefix_template: the console prefix rendered from `text` (output.h's
  // render_line_prefix; `role` for ${role_name}). Empty text: the default prefix.
  struct LinePrefix {
    std::string text;
    std::string role;
  } line_prefix;
  // --stdin_rank: the global rank that gets ddprun's stdin (the others /dev/null); kNoStdinRank
  // ("none"): no rank. Unset: rank 0 when stdin is a terminal, else every worker inherits it.
  static constexpr int kNoStdinRank = -1;
  std::optional<int> stdin_rank;
  // --duplicate_stdout_filters / --duplicate_stderr_filters (torchrun's comma_separated_list:
  // ",," is a literal comma). Lines of the tee'd streams that contain any of the needles are
  // copied to <attempt dir>/filtered_stdout.log / filtered_stderr.log (output.h's
  // DuplicateFilter). Empty: no copy. A given empty value is {""}, which matches every line,
  // as in torchrun.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // --logs_specs: the name of a torchrun.logs_specs Python entry point. ddprun cannot load
  // Python plugins; it keeps its default layout and warns (see `warnings`).
  std::string logs_specs;
  // "console" warns that no events are recorded.
  EventLogHandler event_log_handler = EventLogHandler::Null;
  int verbosity = 0;  // -v: debug logs
  LogFormat log_format = LogFormat::Text;
  bool log_timestamps = false;  // --log_timestamps: text lines begin with the local time
  // --gpu_util_warn: the end-of-run table warns about ranks whose mean GPU utilisation stayed
  // below this (0 = never).
  double gpu_util_warn = 0.85;  // --log_format: ddprun's own lines as text or JSON lines
  // --metrics_port: serve Prometheus metrics (launcher/README.md "Metrics") on
  // metrics_host:metrics_port; 0 = a free port (logged). Unset: no endpoint.
  std::optional<uint16_t> metrics_port;
  std::string metrics_host = "127.0.0.1";
  // Any log files at all for `nproc` local ranks (redirects or tee).
  bool any_files(int nproc) const;
};

// Restarts, signals and stopping.
struct FaultOptions {
  int max_restarts = 0;
  double monitor_interval = 0.1;       // accepted for compatibility; ddprun never polls
  std::vector<int> signals_to_handle;  // signal numbers
  std::string signals_to_handle_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  double shutdown_timeout_s = 30.0;
  // Signals that mean "you are being preempted" (agent_state.h: forwarded, preempt_grace_s for
  // the workers to stop, exit kPreemptedExitCode, no restart). Empty: none ("none" given).
  std::vector<int> preempt_signals;
  std::string preempt_signals_text = "SIGUSR1";
  double preempt_grace_s = 90.0;
  // Once a local worker has exited 0, how long the others may take before they are reported
  // and stopped (kExitBarrierTimeoutExitCode); 0: no limit (torchrun's behaviour).
  double exit_barrier_timeout_s = 0;
  // Restart without waiting for the failed attempt's workers to exit (they are stopped in the
  // background). Single node only; multi-node restarts always wait.
  bool overlap_restart = true;
  // Retry a failure that repeats as a deterministic one (round_state.h kQuickFailure) while
  // restarts are left, instead of ending the job at its second occurrence.
  bool retry_deterministic = false;
  // --hang_timeout: a worker whose progress counter (hang.h) has not moved for this long hangs:
  // its stacks are saved and it fails with the cause "hang". 0: off (the default).
  double hang_timeout_s = 0;
  // --nccl_flight_recorder: set PyTorch's NCCL flight-recorder variables so its dumps land in
  // the run's log directory.
  bool nccl_flight_recorder = false;
};

// Warm spare interpreters (spare_plan.h).
struct SpareOptions {
  // Unset: on when max_restarts > 0 and the entry point runs under Python.
  std::optional<bool> enabled;
  std::vector<std::string> preload = {"torch", "torch.distributed"};  // imported before parking
  SparePriority priority = SparePriority::Idle;
  // --spare_cuda: the spare also warms its local rank's GPU (CUDA context, NCCL's set-up).
  bool cuda = false;
};

// What comes from the machine and its scheduler.
struct PlatformOptions {
  // --numa_binding: torchrun's affinity mode (numa.h); unset when not given. The launch plan
  // resolves the CPU set per local rank it gives on this machine.
  std::optional<NumaMode> numa_binding;
  // What was taken from Slurm's environment (slurm.h), one line; empty outside an srun step or
  // with --no_slurm. Printed by main().
  std::string slurm_summary;
  // --no_preflight: main() skips the quick checks before the launch (doctor.h).
  bool no_preflight = false;
};

struct LaunchOptions {
  NodeOptions nodes;
  RendezvousOptions rendezvous;
  WorkerOptions workers;
  OutputOptions output;
  FaultOptions faults;
  SpareOptions spares;
  PlatformOptions platform;
  // Things the user should know that do not stop the launch (printed by main()).
  std::vector<std::string> warnings;
};

// The raw strings given for each flag (canonical name without dashes, e.g.
// "nproc_per_node"), exactly as typed; flags that take no value map to "1".
struct RawOptions {
  std::map<std::string, std::string> given;
  std::vector<std::string> rest;  // entrypoint and its arguments
};

// Declares every flag on `app` (prefix-command mode) writing into `raw`. `raw` must outlive
// `app`'s parse.
void setup_options(CLI::App& app, RawOptions& raw);

// Validates and converts. Throws UsageError.
LaunchOptions finalize_options(const RawOptions& raw, const EnvMap& env, const SystemInfo& sys);

struct ParseOutcome {
  std::optional<LaunchOptions> options;  // set when the launch should go ahead
  int exit_code = 0;                     // otherwise: 0 for --help, kUsageExitCode for errors
  std::string message;                   // help text or the one-line error
};

// argv[0] is the program name. Never throws.
ParseOutcome parse_command_line(const std::vector<std::string>& argv, const EnvMap& env, const SystemInfo& sys);

// The pieces, exposed for tests. Each throws UsageError naming `flag`.
int parse_nproc_per_node(const std::string& value, const SystemInfo& sys);
std::pair<int, int> parse_nnodes(const std::string& value);
StdStreamSpec parse_std_streams(const std::string& flag, const std::string& value);
std::map<std::string, std::string> parse_rdzv_conf(const std::string& value);
// `flag` names the flag in the error.
std::vector<int> parse_signals(const std::string& value, const std::string& flag = "signals_to_handle");
std::set<int> parse_local_ranks_filter(const std::string& value);
// HOST[:PORT], [IPV6][:PORT] or a bare IPv6 address (no port). `flag` names the flag in the
// error. The host is not checked here (rendezvous_plan.h does, for the flags it uses).
struct HostPort {
  std::string host;
  std::optional<uint16_t> port;  // unset: none given
};
HostPort parse_host_port(const std::string& flag, const std::string& value);
// Throws UsageError for a host no endpoint can have: empty, or with a colon but no IPv6
// literal ("::::garbage:::"). `given`: the flag's whole value, for the message.
void check_endpoint_host(const std::string& flag, const std::string& given, const std::string& host);
// torchrun's comma_separated_list: "a,b" -> {a, b}; ",," is a literal comma; "" -> {""}.
std::vector<std::string> parse_filter_list(const std::string& value);

// The environment of this process as a map.
EnvMap current_environment();

}  // namespace ddprun::launcher
