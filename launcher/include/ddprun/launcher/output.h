// Worker output handling, pure: splitting a byte stream into lines, the console prefix, and
// the bounded tail of a rank's stderr kept for the failure summary.
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

}  // namespace ddprun::launcher
