// Stacks of running workers, taken from outside without stopping them for longer than the
// tool needs: py-spy for Python workers when it is installed (next to the workers' interpreter,
// e.g. a venv's bin/, or on PATH), else the native stacks from eu-stack (elfutils) or gdb in
// batch mode. Each tool runs in its own process group with its output in a file; the whole dump
// (every rank in parallel) is bounded by a time limit, after which a tool still running is
// killed and its file says so. Used by the hang watch and by `ddprun dump`.
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
};

// Finds the tools: py-spy in the directory of `python_exec` (when given) and on `path_var`;
// eu-stack and gdb on `path_var`.
StackTools find_stack_tools(const std::string& python_exec, const std::string& path_var);

// What is read back of one stack file (its text, below): a tool's output is far smaller.
inline constexpr size_t kMaxStackFileBytes = 4 * 1024 * 1024;

struct StackDump {
  StackTarget target;
  std::string tool;  // "py-spy", "eu-stack", "gdb", or "" when none could read it
  std::string file;  // where it was saved
  std::string text;  // what the tool printed (after the file's header line; kMaxStackFileBytes at most)
  bool timed_out = false;
};

// Dumps every target in parallel into `<out_dir>/r<global rank>.txt` (out_dir created),
// within `timeout_s` in all. Never throws for a tool that fails (its file says what happened);
// throws std::system_error when out_dir cannot be created.
std::vector<StackDump> dump_stacks(const std::vector<StackTarget>& targets, const StackTools& tools,
                                   const std::filesystem::path& out_dir, double timeout_s);

// "py-spy", or "eu-stack; native stacks of Python workers: py-spy is not installed (...)": which
// tools made `dumps`, for the log line.
std::string describe_stack_tools(const std::vector<StackDump>& dumps, const StackTools& tools);

// The first `max_lines` lines of `text` ("... (N more lines in FILE)" after them).
std::string first_lines(const std::string& text, size_t max_lines, const std::string& file);

}  // namespace ddprun::launcher
