// Stacks of running workers, taken from outside without stopping them for longer than the
// tool needs: py-spy for Python workers when it is installed (next to the workers' interpreter,
// e.g. a venv's bin/, when that directory is root's or this user's and no one else may change
// it; or on PATH), else the native stacks from eu-stack (elfutils) or gdb in batch mode. Each
// tool runs in its own process group with its output in a new file of a new directory (mode
// 0700, nothing followed or overwritten); the whole dump (every rank in parallel) is bounded by
// a time limit, after which a tool still running is killed and its file says so. Used by the
// hang watch and by `ddprun dump`.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

struct StackTarget {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool python = false;  // the worker runs Python (py-spy can read it)
};

struct StackTools {
  std::optional<std::string> py_spy, eu_stack, gdb;
  std::string refused;  // why the py-spy beside the interpreter is not used ("" when none is refused)
};

// Finds the tools: py-spy in the directory of `python_exec` (when given, and trusted_program
// there: platform/private_files.h) and on `path_var`; eu-stack and gdb on `path_var`. Only the
// absolute directories of `path_var` are searched.
StackTools find_stack_tools(const std::string& python_exec, const std::string& path_var);

// A new directory for one dump: <run_dir>/stacks/<name> (or <name>-2, ... when taken), mode
// 0700; run_dir and stacks/ must be directories of this user (not links). Throws
// std::system_error or std::runtime_error (what is wrong) when it cannot be made.
struct StackDir {
  int fd = -1;        // open; the caller closes it (close_stack_dir)
  std::string path;   // for messages
};
StackDir make_stack_dir(const std::filesystem::path& run_dir, const std::string& name);
void close_stack_dir(StackDir& dir);

struct StackDump {
  StackTarget target;
  std::string tool;  // "py-spy", "eu-stack", "gdb", or "" when none could read it
  std::string file;  // where it was saved
  std::string text;  // what the tool printed (after the file's header line)
  bool timed_out = false;
};

// Dumps every target in parallel into new files `r<global rank>.txt` of `out` (make_stack_dir),
// within `timeout_s` in all. Never throws for a tool that fails (its file says what happened).
std::vector<StackDump> dump_stacks(const std::vector<StackTarget>& targets, const StackTools& tools,
                                   const StackDir& out, double timeout_s);

// "py-spy", or "eu-stack; native stacks of Python workers: py-spy is not installed (...)": which
// tools made `dumps`, for the log line.
std::string describe_stack_tools(const std::vector<StackDump>& dumps, const StackTools& tools);

// The first `max_lines` lines of `text` ("... (N more lines in FILE)" after them).
std::string first_lines(const std::string& text, size_t max_lines, const std::string& file);

}  // namespace ddprun::launcher
