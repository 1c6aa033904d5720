// Entry-point resolution and log paths against real files in a temporary directory.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddprun/launcher/entrypoint.h"
#include "ddprun/launcher/log_paths.h"

using namespace ddprun::launcher;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "ddprun-entry-XXXXXX").string();
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& text, bool exec) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(path_ / name) << text;
    ::chmod((path_ / name).c_str(), exec ? 0755 : 0644);
    return (path_ / name).string();
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

WorkerOptions entry(const std::string& e) {
  WorkerOptions o;
  o.entrypoint = e;
  return o;
}

}  // namespace

TEST_CASE("entry points that run with Python, as torchrun's default", "[entrypoint]") {
  TempDir d;
  const auto script = d.file("train", "print(1)\n", false);
  const auto prog = d.file("prog", "#!/bin/sh\n", true);
  const auto py = d.file("t.py", "", true);
  CHECK(runs_with_python(entry(script), probe_entrypoint(script)));    // exists, not executable
  CHECK_FALSE(runs_with_python(entry(prog), probe_entrypoint(prog)));  // a program: exec'd
  CHECK(runs_with_python(entry(py), probe_entrypoint(py)));            // .py, even when executable
  CHECK(runs_with_python(entry("missing.py"), probe_entrypoint("missing.py")));
  CHECK_FALSE(runs_with_python(entry("echo"), probe_entrypoint(d.path() / "echo")));  // PATH lookup
  auto m = entry("pkg.mod");
  m.module = true;
  CHECK(runs_with_python(m, {}));
}

TEST_CASE("a directory or a non-executable --no_python entry point says what it is", "[entrypoint]") {
  TempDir d;
  const auto script = d.file("train", "print(1)\n", false);
  fs::create_directories(d.path() / "pkgdir");
  const std::string dir = (d.path() / "pkgdir").string();
  auto np = entry(script);
  np.no_python = true;
  CHECK_THROWS_WITH(runs_with_python(np, probe_entrypoint(script)),
                    Catch::Contains("exists but is not executable") && Catch::Contains("chmod +x"));
  auto npd = entry(dir);
  npd.no_python = true;
  CHECK_THROWS_WITH(runs_with_python(npd, probe_entrypoint(dir)), Catch::Contains("is a directory"));
  CHECK_THROWS_WITH(runs_with_python(entry(dir), probe_entrypoint(dir)),
                    Catch::Contains("is a directory without __main__.py"));
  d.file("pkgdir/__main__.py", "print(1)\n", false);
  CHECK(runs_with_python(entry(dir), probe_entrypoint(dir)));
}

TEST_CASE("resolve_worker_command: argv, executable and the interpreter", "[entrypoint]") {
  TempDir d;
  const auto script = d.file("train", "print(1)\n", false);
  const auto fake_python = d.file("venv/bin/python", "#!/bin/sh\n", true);
  d.file("venv/pyvenv.cfg", "home = /usr/bin\nversion = 3.11.2\n", false);
  auto cmd = resolve_worker_command(entry(script), {{"PYTHON_EXEC", fake_python}});
  CHECK(cmd.executable == fake_python);
  CHECK(cmd.argv == std::vector<std::string>{fake_python, "-u", script});
  CHECK(cmd.interpreter == fake_python + " (Python 3.11.2)");

  const auto prog = d.file("prog", "#!/bin/sh\n", true);
  auto p = resolve_worker_command(entry(prog), {});
  CHECK(p.executable == prog);
  CHECK(p.interpreter.empty());

  CHECK_THROWS_WITH(resolve_worker_command(entry(script), {{"PYTHON_EXEC", "no-such-python"}, {"PATH", d.path()}}),
                    Catch::Contains("cannot find the Python interpreter") && Catch::Contains("PYTHON_EXEC"));
  CHECK_THROWS_WITH(resolve_worker_command(entry("no-such-prog"), {{"PATH", d.path()}}),
                    Catch::Contains("cannot find 'no-such-prog' on PATH"));
}

TEST_CASE("python version from pyvenv.cfg or the resolved name", "[entrypoint]") {
  TempDir d;
  const auto venv_python = d.file("v/bin/python", "", true);
  d.file("v/pyvenv.cfg", "version_info = 3.12.1.final.0\n", false);
  CHECK(probe_python_version(venv_python) == "3.12.1");
  const auto real = d.file("bin/python3.10", "", true);
  fs::create_symlink(real, d.path() / "bin/python3");
  CHECK(probe_python_version((d.path() / "bin/python3").string()) == "3.10");
  CHECK(probe_python_version(d.file("bin/mypy", "", true)).empty());
  CHECK(describe_interpreter("/usr/bin/python3", "3.11.2") == "/usr/bin/python3 (Python 3.11.2)");
  CHECK(describe_interpreter("/x/py", "") == "/x/py (Python, version unknown)");
  CHECK(start_line_note("/usr/bin/python3 (Python 3.11.2)") == "; Python workers: /usr/bin/python3 (Python 3.11.2)");
  CHECK(start_line_note("").empty());
}

TEST_CASE("log dirs: a unique run directory per launch, never an earlier one", "[entrypoint]") {
  TempDir d;
  CHECK(run_log_dir_template("/logs", "job7") == "/logs/job7_XXXXXX");
  CHECK(run_log_dir_template("/logs", "a/b") == "/logs/a_b_XXXXXX");
  const std::string logs = (d.path() / "logs/deeper").string();
  auto first = make_run_log_dir(logs, "none");
  auto second = make_run_log_dir(logs, "none");
  CHECK(first != second);
  CHECK(fs::is_directory(first));
  CHECK(fs::is_directory(second));
  CHECK(first.parent_path() == fs::path(logs));
  CHECK(first.filename().string().rfind("none_", 0) == 0);
  CHECK(attempt_log_dir(first, 2) == first / "attempt_2");
  // A later round of the same attempt (elastic scale-up) gets its own directory.
  CHECK(fresh_attempt_log_dir(first, 0) == first / "attempt_0");
  fs::create_directories(first / "attempt_0");
  CHECK(fresh_attempt_log_dir(first, 0) == first / "attempt_0.1");
  fs::create_directories(first / "attempt_0.1");
  CHECK(fresh_attempt_log_dir(first, 0) == first / "attempt_0.2");
  CHECK(fresh_attempt_log_dir(first, 1) == first / "attempt_1");
  const auto file = d.file("plain", "", false);
  CHECK_THROWS_WITH(make_run_log_dir(file, "none"),
                    Catch::Contains("not a directory") || Catch::Contains("cannot create"));
}

TEST_CASE("a Python shim is resolved to the interpreter it runs; anything else is left alone", "[entrypoint]") {
  TempDir d;
  const auto shim = d.file("python3", "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n", true);
  CHECK(resolve_python_shim(shim) == std::optional<std::string>("/usr/bin/python3"));
  CHECK_FALSE(resolve_python_shim("/usr/bin/python3"));                               // the interpreter itself
  CHECK_FALSE(resolve_python_shim(d.file("says_hi", "#!/bin/sh\necho hi\n", true)));  // not a path
  CHECK_FALSE(resolve_python_shim(d.file("fails", "#!/bin/sh\nexit 3\n", true)));     // no answer
  CHECK_FALSE(resolve_python_shim(d.file("names_a_script", "#!/bin/sh\nprintf %s " + shim + "\n", true)));
}

TEST_CASE("a Python shim is asked in isolated mode: nothing from the working directory or PYTHONPATH runs",
          "[entrypoint]") {
  TempDir d;
  const auto shim = d.file("bin/python3", "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n", true);
  // What a shared directory could hold: code Python runs at start-up when its directory is on
  // the path (PYTHONPATH, or the working directory through it).
  const std::string marker = (d.path() / "ran").string();
  d.file("shared/sitecustomize.py", "open('" + marker + "', 'w').close()\n", false);
  d.file("shared/sys.py", "open('" + marker + "', 'w').close()\n", false);
  const char* old_pp = std::getenv("PYTHONPATH");
  const std::string saved_pp = old_pp ? old_pp : "";
  const fs::path saved_cwd = fs::current_path();
  ::setenv("PYTHONPATH", ".", 1);
  fs::current_path(d.path() / "shared");
  const auto got = resolve_python_shim(shim);
  fs::current_path(saved_cwd);
  if (old_pp) ::setenv("PYTHONPATH", saved_pp.c_str(), 1);
  else ::unsetenv("PYTHONPATH");
  CHECK(got == std::optional<std::string>("/usr/bin/python3"));
  CHECK_FALSE(fs::exists(marker));
}
