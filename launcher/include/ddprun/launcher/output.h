// Worker output handling, pure: splitting a byte stream into lines, the console prefix, the
// bounded tail of a rank's stderr kept for the failure summary, the filter of
// --duplicate_{stdout,stderr}_filters and the hint for a worker that could not import a module.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// "[r3]: " on a single node, "[n1 r3]: " when the job spans nodes.
std::string console_prefix(int node_rank, int global_rank, bool multi_node);

// --log_line_prefix_template (torchrun 2.15's): `tmpl` with $name or ${name} replaced for
// rank, local_rank, role_name and hostname, and $$ by $; any other $ is kept as written (as
// Python's string.Template.safe_substitute, which torchrun uses).
struct LinePrefixFields {
  int rank = 0;
  int local_rank = 0;
  std::string_view role_name;
  std::string_view hostname;
};
std::string render_line_prefix(std::string_view tmpl, const LinePrefixFields& fields);

// Splits a stream into lines (the '\n' is kept off). A line longer than `max_line` is cut
// into pieces so memory stays bounded.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  // Appends the complete lines found in `bytes` to `lines`.
  void feed(std::string_view bytes, std::vector<std::string>& lines);
  // The unterminated rest, if any (at end of stream).
  bool flush(std::string& line);
  // The unterminated rest, left in place.
  const std::string& pending() const { return partial_; }

 private:
  size_t max_line_;
  std::string partial_;
};

// The last `capacity` lines (each cut to `max_line` bytes).
class TailBuffer {
 public:
  explicit TailBuffer(size_t capacity = 20, size_t max_line = 1024)
      : capacity_(capacity), max_line_(max_line) {}
  void push(std::string_view line);
  const std::deque<std::string>& lines() const { return lines_; }
  void clear() { lines_.clear(); }

 private:
  size_t capacity_;
  size_t max_line_;
  std::deque<std::string> lines_;
};

// --duplicate_stdout_filters / --duplicate_stderr_filters, as torchrun 2.11 applies them: a
// line is copied to the attempt's filtered_stdout.log / filtered_stderr.log when it contains
// any needle (plain substring, case-sensitive; an empty needle matches every line). Only the
// streams that are tee'd (-t/--tee) and shown on the console (--local_ranks_filter) are
// considered, every such rank into one file; each copied line carries the console prefix.
class DuplicateFilter {
 public:
  DuplicateFilter() = default;
  explicit DuplicateFilter(std::vector<std::string> needles) : needles_(std::move(needles)) {}
  // No needles: nothing is copied and no file is made.
  bool enabled() const { return !needles_.empty(); }
  bool matches(std::string_view line) const;
  // Whether a stream takes part: `tee_mask` is the rank's --tee mask, `stream_bit` kStreamOut
  // or kStreamErr (options.h), `console_allowed` whether --local_ranks_filter lets it print.
  bool applies_to(int tee_mask, int stream_bit, bool console_allowed) const {
    return enabled() && (tee_mask & stream_bit) != 0 && console_allowed;
  }

 private:
  std::vector<std::string> needles_;
};

// What the console holds of a stream whose log file failed, as it was at the file's first
// failure: Every line (tee'd, or the file never opened), every line From the failure on
// (redirected: lines 1..file_only_lines are in the file only), or None (--local_ranks_filter
// keeps the rank off the console: what the file lacks is lost).
struct LogConsole {
  enum class Kind { Every, From, None } kind = Kind::Every;
  uint64_t file_only_lines = 0;
};

// Writes to log files (--log_dir's stdout.log/stderr.log under -r/-t, the filtered logs) that
// failed: a full disk (ENOSPC), an I/O error (EIO), a file that could not be created. The
// stream's lines go to the console from then on (a redirected one too); this keeps what the
// user must be told:
// one warning per file (the first failure), at most kMaxWarnings files named on the console
// (then one line saying the rest are counted for the summary only), and the summary's list.
// A later write to the same file is still attempted (space may come back), so a file may hold
// output after a gap; the bytes counted here are those not written.
class LogWriteFailures {
 public:
  static constexpr size_t kMaxWarnings = 8;
  static constexpr size_t kMaxSummaryFiles = 10;

  using Console = LogConsole;
  // The console line to print for this failure, or "" when this file was already reported
  // (or the warning budget is spent and its closing line printed).
  std::string record(const std::string& path, int err, uint64_t bytes_lost, Console console = {});
  bool any() const { return !files_.empty(); }
  size_t files() const { return files_.size(); }
  uint64_t bytes_lost() const;
  // The summary's lines (no "[ddprun]" prefix, no newline): one per file, most lost first,
  // at most kMaxSummaryFiles, then "... and N more".
  std::vector<std::string> summary_lines() const;
  // What the summary's heading says of the console: "the console got every line" only when it
  // did, for every file listed.
  std::string console_note() const;

 private:
  struct File {
    int first_errno = 0;
    uint64_t bytes_lost = 0;
    uint64_t failures = 0;
    Console console;
  };
  std::map<std::string, File> files_;
  size_t warned_ = 0;
};

// When a worker's stderr tail shows a failed import (ModuleNotFoundError, "No module named"),
// one line saying which interpreter ran it and how to pick another (PYTHON_EXEC); empty
// otherwise, and for non-Python workers (`interpreter` empty).
std::string missing_module_hint(const std::deque<std::string>& stderr_tail, const std::string& interpreter);

}  // namespace ddprun::launcher
