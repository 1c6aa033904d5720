// Resolving what a worker runs, once at launch: which program, its argv, and for Python
// workers which interpreter (said in the start line, and in the summary of a worker that
// could not import a module).
//
// torchrun runs every entry point with Python unless --no_python. ddprun also execs an
// executable program directly (`ddprun ./a.out`, `ddprun echo`), and otherwise follows
// torchrun: `x.py`, a file that exists but is not executable, and a directory with a
// __main__.py run as `$PYTHON_EXEC -u <entry point>`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ddprun/launcher/options.h"

namespace ddprun::launcher {

// What stat() says about the entry point (filled by probe_entrypoint; pure decisions below).
struct EntrypointFacts {
  bool exists = false;
  bool is_directory = false;
  bool is_executable = false;     // a regular file with an execute bit for us
  bool has_main_py = false;       // a directory with __main__.py
};
EntrypointFacts probe_entrypoint(const std::string& path);

// Whether the entry point runs under Python: -m, --run_path, `.py`, and (without --no_python)
// an existing non-executable file or a directory with __main__.py. Throws UsageError saying
// what the entry point is when it cannot run: a directory, or (with --no_python) a file that
// is not executable.
bool runs_with_python(const WorkerOptions& opts, const EntrypointFacts& facts);

// The Python version an interpreter path belongs to, from files only (no process is started,
// so the launch costs nothing): a virtual environment's pyvenv.cfg ("version = 3.11.2"), else
// the name the path resolves to ("python3.11"); empty when neither tells.
std::string probe_python_version(const std::string& interpreter_path);

// "/usr/bin/python3 (Python 3.11.2)"; "(Python, version unknown)" without a version.
std::string describe_interpreter(const std::string& path, const std::string& version);

// "; Python workers: <interpreter>" for the agent's start line; empty for other workers.
std::string start_line_note(const std::string& interpreter);

// When `path` is a script (a pyenv-style shim), the interpreter it runs (sys.executable, asked
// once with the agent's cwd and environment, bounded at 10 s); nullopt for a real interpreter or
// a shim that does not answer with an executable.
std::optional<std::string> resolve_python_shim(const std::string& path);

struct WorkerCommand {
  std::string executable;          // the path execve gets
  std::vector<std::string> argv;   // argv[0] included
  std::string interpreter;         // describe_interpreter(...) for Python workers, else empty
};

// The whole resolution: argv (worker_env.h's build_worker_argv), the program on PATH, the
// interpreter's version. Throws UsageError (exit 2, nothing started) when it cannot run.
WorkerCommand resolve_worker_command(const WorkerOptions& opts, const EnvMap& env);

}  // namespace ddprun::launcher
