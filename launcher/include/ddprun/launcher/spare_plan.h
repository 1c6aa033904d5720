// Warm spare interpreters, the pure decisions: whether a worker command can start
// from a spare, whether a spare started with one environment may run an attempt that needs
// another, and the launch message the agent sends a spare. The processes live in spares.cpp.
//
// A spare is `python -u -c <bootstrap>` (launcher/src/spares/spare_bootstrap.py) that has imported
// the preload modules and waits on a socket. On a restart it receives the attempt's cwd, argv
// and environment and runs the entry point as `python -u script.py` / `-m module` / `-c code`
// would. What the interpreter fixed at its own start-up from the environment (sys.flags,
// sys.path from PYTHONPATH, the locale, libgomp's OMP_* settings read when torch loaded it)
// cannot change afterwards, so a spare only serves an attempt whose environment differs from
// the one it started with in the variables ddprun sets per attempt and rank.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/options.h"

namespace ddprun::launcher {

// The variables that may differ between a spare's start and its use (ddprun sets them per
// attempt and rank; worker_env.h): RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*, TORCHELASTIC_*, ...
const std::vector<std::string>& spare_per_attempt_variables();

// Empty when a spare started with `started` may run with `wanted`; otherwise why not, naming
// the first variable that differs ("PYTHONPATH differs", "FOO is unset now").
std::string spare_env_mismatch(const EnvMap& started, const EnvMap& wanted);

// Whether `argv` is a Python command line a spare can replay: PYTHON -u then a script path,
// `-m MODULE` or `-c CODE`, then the arguments (what build_worker_argv makes for Python entry
// points).
bool spare_can_run(const std::vector<std::string>& argv);

// Whether spares are on: --warm_spares when given, else when restarts are enabled; only for
// Python entry points (`python_entry`) that spare_can_run.
bool spares_enabled(const SpareOptions& spares, int max_restarts, bool python_entry);

// The spare's command line: PYTHON -u -c <bootstrap> CTL_FD PRIORITY PRELOAD GPU -- COLD_ARGV...
// (GPU: "cuda" with --spare_cuda=1, else "-").
std::vector<std::string> spare_argv(const std::vector<std::string>& cold_argv, int ctl_fd,
                                    const std::string& priority, const std::vector<std::string>& preload,
                                    bool cuda = false);

// The spare's "ready" message on its control socket, one line:
//   R <import seconds> <threads> -                                   GPU not asked for
//   R <import seconds> <threads> gpu <device> <context ms> <nccl ms> warmed (nccl ms "-": no NCCL)
//   R <import seconds> <threads> nogpu <why, to the end of the line> asked for, not done
struct SpareReady {
  double import_s = 0;
  int threads = 0;
  enum class Gpu { NotAsked, Warm, Skipped } gpu = Gpu::NotAsked;
  int device = -1;            // Warm: the CUDA device ordinal (under CUDA_VISIBLE_DEVICES)
  double context_ms = 0;      // Warm: creating the context
  double nccl_ms = -1;        // Warm: NCCL's set-up, one all_reduce and the teardown; -1: none
  std::string why;            // Skipped: the reason; Warm without NCCL: why not
};
// Nullopt for a line that is not a ready message.
std::optional<SpareReady> parse_spare_ready(const std::string& line);

// The launch message's payload (after the "G" + 8-byte length header): cwd, argc, argv,
// then "K=V" entries, each NUL-terminated.
std::string encode_spare_launch(const std::string& cwd, const std::vector<std::string>& argv, const EnvMap& env);

// The bootstrap's source (embedded at build time).
const char* spare_bootstrap_source();

}  // namespace ddprun::launcher
