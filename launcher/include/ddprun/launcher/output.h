// Worker output handling, pure: splitting a byte stream into lines, the console prefix, the
// bounded tail of a rank's stderr kept for the failure summary, the filter of
// --duplicate_{stdout,stderr}_filters and the hint for a worker that could not import a module.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// "[r3]: " on a single node, "[n1 r3]: " when the job spans nodes.
std::string console_prefix(int node_rank, int global_rank, bool multi_node);

// Splits a stream into lines (the '\n' is kept off). A line longer than `max_line` is cut
// into pieces so memory stays bounded.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  // Appends the complete lines found in `bytes` to `lines`.
  void feed(std::string_view bytes, std::vector<std::string>& lines);
  // The unterminated rest, if any (at end of stream).
  bool flush(std::string& line);

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

// When a worker's stderr tail shows a failed import (ModuleNotFoundError, "No module named"),
// one line saying which interpreter ran it and how to pick another (PYTHON_EXEC); empty
// otherwise, and for non-Python workers (`interpreter` empty).
std::string missing_module_hint(const std::deque<std::string>& stderr_tail, const std::string& interpreter);

}  // namespace ddprun::launcher
