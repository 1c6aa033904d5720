// The console as the workers' own terminal, pure (no I/O): every worker stream's bytes become
// the bytes to write to ddprun's stdout / stderr, with the rank prefix at the start of each
// console line.
//
// - Complete lines go out at once, whole: two ranks' lines never mix on one console line.
// - A partial line (no '\n' yet: a prompt such as pdb's "(Pdb) ", input()'s question) goes
//   out once it has waited kPartialHold for its end; the rest of it follows as it comes.
// - A carriage return starts a progress-bar line (tqdm writes "\r 45%|####  | ..."): the line
//   is redrawn in place ("\r" + prefix + what a terminal would show, padded over what was
//   there), at most once per kBarInterval per stream, always with its last state; the line's
//   final state goes out with its '\n'. "\r\n" is a plain line end.
// - When another stream takes the console line, a plain partial line is closed with '\n'
//   first (it stays readable, and continues on a new prefixed line); a progress bar is
//   overwritten instead (it is redrawn at its next update), so bars of several ranks share
//   one line, as they do on one terminal.
// - The rank that reads ddprun's terminal (interactive): the continuation of a partial line
//   that was shown starts with the prefix again, because the user's Enter has moved the
//   terminal to a new line (pdb: "[r0]: (Pdb) p x", then "[r0]: 41").
// stdout and stderr are one console when they are the same file (a terminal); otherwise each
// keeps its own line state.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

class ConsoleMux {
 public:
  using Clock = std::chrono::steady_clock;
  using StreamId = uint64_t;  // the caller's name for a stream (a worker's stdout or stderr)
  static constexpr std::chrono::milliseconds kPartialHold{50};
  static constexpr std::chrono::milliseconds kBarInterval{100};
  static constexpr size_t kMaxLine = 64 * 1024;  // a longer line is cut (as LineSplitter does)

  struct Write {
    int fd;  // 1 or 2
    std::string bytes;
  };

  // `shared`: fds 1 and 2 are the same file (one line state for both).
  explicit ConsoleMux(bool shared) : shared_(shared) {}

  // Bytes of stream `id`, which goes to `fd` (1 or 2) with `prefix` ("" for none): appends what
  // to write now to `out`. `interactive`: the stream's process reads ddprun's terminal.
  void feed(StreamId id, int fd, std::string_view prefix, std::string_view bytes, Clock::time_point now,
            std::vector<Write>& out, bool interactive = false);
  // End of stream: an unterminated line is ended with '\n'; the stream is forgotten.
  void close(StreamId id, Clock::time_point now, std::vector<Write>& out);
  // Shows the held partial lines and bar states whose time has come.
  void flush_due(Clock::time_point now, std::vector<Write>& out);
  // When flush_due() next has something to show; none when nothing is held.
  std::optional<Clock::time_point> next_due() const;

  // What a terminal shows of `line` (carriage returns overwrite from the first column);
  // a line without '\r' is returned as it is.
  static std::string visible(std::string_view line);

 private:
  struct Stream {
    int fd = 1;
    std::string prefix;
    bool interactive = false;
    std::vector<std::string> cells;  // one UTF-8 character each: the line as a terminal shows it
    size_t col = 0;                  // where the next character lands
    bool cr_pending = false;         // a '\r' whose meaning the next byte decides ("\r\n" or not)
    bool bar = false;                // the line had a carriage return: redrawn, not appended
    size_t shown = 0;                // plain line: cells already on the console
    bool started = false;            // the console has shown part of this line
    bool dirty = false;              // holds what the console does not show yet
    Clock::time_point dirty_since{};
    Clock::time_point last_drawn{};
    bool drawn_ever = false;
  };
  struct Sink {
    std::optional<StreamId> owner;  // the stream whose line the console's last line is
    bool owner_bar = false;
    size_t width = 0;  // characters on the console's open line (prefix included)
  };

  Sink& sink_of(int fd) { return shared_ || fd == 1 ? sinks_[0] : sinks_[1]; }
  void put(Stream& s, char c);
  void end_line(StreamId id, Stream& s, std::vector<Write>& out);
  void show(StreamId id, Stream& s, Clock::time_point now, std::vector<Write>& out);
  // Makes room on the console for stream `id`'s output of the given kind.
  void take_line(StreamId id, Stream& s, bool as_bar, std::vector<Write>& out);
  std::optional<Clock::time_point> due(const Stream& s) const;
  std::string text(const Stream& s, size_t from) const;

  bool shared_;
  Sink sinks_[2];
  std::map<StreamId, Stream> streams_;
};

}  // namespace ddprun::launcher
