#include "ddprun/launcher/entrypoint.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "ddprun/common/knobs.h"
#include "ddprun/launcher/process.h"
#include "ddprun/launcher/worker_env.h"

namespace fs = std::filesystem;

namespace ddprun::launcher {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// "3.11.2.final.0" -> "3.11.2"; keeps at most three dot-separated numbers.
std::string numeric_version(const std::string& v) {
  std::string out;
  int parts = 0;
  for (size_t i = 0; i < v.size() && parts < 3;) {
    size_t j = i;
    while (j < v.size() && std::isdigit(static_cast<unsigned char>(v[j]))) ++j;
    if (j == i) break;
    if (!out.empty()) out += '.';
    out += v.substr(i, j - i);
    ++parts;
    if (j >= v.size() || v[j] != '.') break;
    i = j + 1;
  }
  return parts >= 2 ? out : "";
}

}  // namespace

EntrypointFacts probe_entrypoint(const std::string& path) {
  EntrypointFacts f;
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return f;
  f.exists = true;
  f.is_directory = S_ISDIR(st.st_mode);
  f.is_executable = S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  if (f.is_directory) {
    struct stat m {};
    f.has_main_py = ::stat((path + "/__main__.py").c_str(), &m) == 0 && S_ISREG(m.st_mode);
  }
  return f;
}

bool runs_with_python(const WorkerOptions& opts, const EntrypointFacts& facts) {
  const std::string& e = opts.entrypoint;
  if (opts.module || opts.run_path) return true;
  if (opts.no_python) {
    if (facts.exists && facts.is_directory) {
      throw UsageError("'" + e +
                       "' is a directory, not a program (--no_python execs the entry point); "
                       "give the program inside it");
    }
    if (facts.exists && !facts.is_executable) {
      throw UsageError("'" + e +
                       "' exists but is not executable; chmod +x it, or drop --no_python to run it "
                       "with Python");
    }
    return false;
  }
  if (facts.exists && facts.is_directory) {
    if (facts.has_main_py) return true;  // python runs <dir>/__main__.py, as under torchrun
    throw UsageError("'" + e + "' is a directory without __main__.py; give the script or program inside it");
  }
  if (ends_with(e, ".py")) return true;
  // torchrun's default entry point is Python's: a script without `.py` and without an
  // execute bit is still a Python script.
  return facts.exists && !facts.is_executable;
}

std::string probe_python_version(const std::string& interpreter_path) {
  std::error_code ec;
  const fs::path p(interpreter_path);
  std::ifstream cfg(p.parent_path().parent_path() / "pyvenv.cfg");
  std::string line;
  while (std::getline(cfg, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = trim(line.substr(0, eq));
    if (key == "version" || key == "version_info") {
      std::string v = numeric_version(trim(line.substr(eq + 1)));
      if (!v.empty()) return v;
    }
  }
  const std::string name = fs::canonical(p, ec).filename().string();
  if (!ec && name.rfind("python", 0) == 0) return numeric_version(name.substr(6));
  return "";
}

bool is_script(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char head[2] = {0, 0};
  f.read(head, 2);
  return f.gcount() == 2 && head[0] == '#' && head[1] == '!';
}

std::optional<std::string> resolve_python_shim(const std::string& shim) {
  if (!is_script(shim)) return std::nullopt;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    const int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      ::dup2(devnull, STDIN_FILENO);
      ::dup2(devnull, STDERR_FILENO);
    }
    // Isolated (-I): nothing from the working directory, PYTHONPATH or the user's site directory.
    const char* argv[] = {shim.c_str(), "-I", "-c", "import sys; sys.stdout.write(sys.executable)", nullptr};
    ::execv(shim.c_str(), const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fds[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0) {
      ::kill(pid, SIGKILL);  // a shim that hangs: keep it, say nothing more
      out.clear();
      break;
    }
    char buf[512];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || out.size() > 4096) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || out.empty() || out[0] != '/') return std::nullopt;
  if (::access(out.c_str(), X_OK) != 0 || is_script(out)) return std::nullopt;
  return out;
}

std::string describe_interpreter(const std::string& path, const std::string& version) {
  return path + (version.empty() ? " (Python, version unknown)" : " (Python " + version + ")");
}

std::string start_line_note(const std::string& interpreter) {
  return interpreter.empty() ? "" : "; Python workers: " + interpreter;
}

WorkerCommand resolve_worker_command(const WorkerOptions& opts, const EnvMap& env) {
  const bool python = runs_with_python(opts, opts.module ? EntrypointFacts{} : probe_entrypoint(opts.entrypoint));
  WorkerCommand cmd;
  cmd.argv = build_worker_argv(opts, env, python);
  auto path = env.count("PATH") ? env.at("PATH") : std::string();
  auto exe = find_executable(cmd.argv[0], path);
  if (!exe) {
    if (python) {
      throw UsageError("cannot find the Python interpreter '" + cmd.argv[0] + "'" +
                       (cmd.argv[0].find('/') == std::string::npos ? " on PATH" : "") + "; set " +
                       knobs::kPythonExec.name + "=/path/to/python");
    }
    throw UsageError(
        "cannot find '" + cmd.argv[0] + "'" + (cmd.argv[0].find('/') == std::string::npos ? " on PATH" : "") +
        (cmd.argv[0].find('/') == std::string::npos ? " (a program in this directory: ./" + cmd.argv[0] + ")" : ""));
  }
  cmd.executable = *exe;
  if (!python) return cmd;
  // A shim first on PATH (pyenv's is a shell script that starts the interpreter it selects,
  // ~150 ms a start): resolve it once, as the workers' cwd and environment select, and exec
  // the interpreter itself. PYTHON_EXEC is taken as given.
  std::string via;
  if (!knobs::get(knobs::kPythonExec, env) && cmd.argv[0].find('/') == std::string::npos) {
    if (auto real = resolve_python_shim(cmd.executable)) {
      via = ", through the shim " + cmd.executable;
      cmd.executable = *real;
      cmd.argv[0] = *real;
    }
  }
  cmd.interpreter = describe_interpreter(cmd.executable, probe_python_version(cmd.executable));
  if (!via.empty()) cmd.interpreter.insert(cmd.interpreter.size() - 1, via);
  return cmd;
}

}  // namespace ddprun::launcher
