// ConsoleMux: the workers' streams as they reach ddprun's console (complete lines whole and at
// once, partial lines after a short hold, progress bars redrawn in place and rate-limited),
// checked on the exact bytes written, with a fake clock.
#include <catch2/catch.hpp>

#include "ddprun/launcher/console.h"

using namespace ddprun::launcher;
using namespace std::chrono_literals;

namespace {

struct Console {
  explicit Console(bool shared = true) : mux(shared) {}
  ConsoleMux mux;
  ConsoleMux::Clock::time_point t{};  // the fake clock
  std::vector<ConsoleMux::Write> out;

  // What was written since the last call, fds merged (the terminal's view when shared).
  std::string take() {
    std::string s;
    for (auto& w : out) s += w.bytes;
    out.clear();
    return s;
  }
  void feed(ConsoleMux::StreamId id, std::string_view bytes, int fd = 1) {
    mux.feed(id, fd, "[r" + std::to_string(id) + "]: ", bytes, t, out);
  }
  void advance(std::chrono::milliseconds d) {
    t += d;
    mux.flush_due(t, out);
  }
};

}  // namespace

TEST_CASE("complete lines go out at once, whole, with the prefix", "[console]") {
  Console c;
  c.feed(0, "hello\nwor");
  CHECK(c.take() == "[r0]: hello\n");
  c.feed(1, "other\n");
  CHECK(c.take() == "[r1]: other\n");  // rank 0's "wor" waits for its hold, not interleaved
  c.feed(0, "ld\r\n");                  // CRLF is a plain line end
  CHECK(c.take() == "[r0]: world\n");
  CHECK_FALSE(c.mux.next_due());
}

TEST_CASE("a partial line (a prompt) goes out after the hold, its rest follows without a new prefix", "[console]") {
  Console c;
  c.feed(0, "(Pdb) ");
  CHECK(c.take().empty());
  REQUIRE(c.mux.next_due() == c.t + ConsoleMux::kPartialHold);
  c.advance(ConsoleMux::kPartialHold - 1ms);
  CHECK(c.take().empty());
  c.advance(1ms);
  CHECK(c.take() == "[r0]: (Pdb) ");
  CHECK_FALSE(c.mux.next_due());
  c.feed(0, "41\n");  // the answer, after the user's line (echoed by the terminal)
  CHECK(c.take() == "41\n");
}

TEST_CASE("another stream's line closes an open partial line, which continues on a prefixed line", "[console]") {
  Console c;
  c.feed(0, "Continue? ");
  c.advance(ConsoleMux::kPartialHold);
  CHECK(c.take() == "[r0]: Continue? ");
  c.feed(1, "a log line\n");
  CHECK(c.take() == "\n[r1]: a log line\n");
  c.feed(0, "yes\n");
  CHECK(c.take() == "[r0]: yes\n");
}

TEST_CASE("a progress bar is redrawn in place, at most once per interval, with its last state", "[console]") {
  Console c;
  c.feed(0, "\r  0%|    |");
  CHECK(c.take() == "\r[r0]:   0%|    |");  // the first state at once
  c.t += 10ms;
  c.feed(0, "\r 10%|    |\r 20%|    |");
  CHECK(c.take().empty());  // too soon: held
  REQUIRE(c.mux.next_due() == c.t - 10ms + ConsoleMux::kBarInterval);
  c.advance(ConsoleMux::kBarInterval - 10ms);
  CHECK(c.take() == "\r[r0]:  20%|    |");  // the latest state only
  c.t += ConsoleMux::kBarInterval;
  c.feed(0, "\r 30%|#   |");
  CHECK(c.take() == "\r[r0]:  30%|#   |");  // the interval passed: at once
  c.t += 1ms;
  c.feed(0, "\r100%|####|\n");  // its end goes out at once, with the final state
  CHECK(c.take() == "\r[r0]: 100%|####|\n");
  CHECK_FALSE(c.mux.next_due());
}

TEST_CASE("a line ending in a carriage return keeps its text on the console", "[console]") {
  Console c;
  c.feed(0, "step 1\r");
  CHECK(c.take().empty());  // no carriage return seen yet: a plain partial line
  c.feed(0, "step 2\r");
  CHECK(c.take() == "\r[r0]: step 2");
  c.t += ConsoleMux::kBarInterval;
  c.feed(0, "go\r");  // a shorter text overwrites the start only, as on a terminal
  CHECK(c.take() == "\r[r0]: goep 2");
  c.mux.close(0, c.t, c.out);
  CHECK(c.take() == "\n");
}

TEST_CASE("bars of two streams share one console line, padded over the longer one", "[console]") {
  Console c;
  c.feed(0, "\rrank zero 50%");
  CHECK(c.take() == "\r[r0]: rank zero 50%");
  c.feed(1, "\rr1 5%");
  CHECK(c.take() == "\r[r1]: r1 5%" + std::string(8, ' '));
  c.feed(2, "plain\n");  // a complete line overwrites the bar; the bar comes back below it
  CHECK(c.take() == "\r[r2]: plain\n");
  c.t += ConsoleMux::kBarInterval;
  c.feed(0, "\rrank zero 60%");
  CHECK(c.take() == "\r[r0]: rank zero 60%");
}

TEST_CASE("a bar does not overwrite another stream's open prompt", "[console]") {
  Console c;
  c.feed(0, "(Pdb) ");
  c.advance(ConsoleMux::kPartialHold);
  CHECK(c.take() == "[r0]: (Pdb) ");
  c.feed(1, "\r 5%");
  CHECK(c.take() == "\n\r[r1]:  5%");
  c.feed(0, "p x");  // a plain partial over the bar: the bar's line is closed first
  c.advance(ConsoleMux::kPartialHold);
  CHECK(c.take() == "\n[r0]: p x");
}

TEST_CASE("UTF-8 bar characters count as one column each", "[console]") {
  Console c;
  c.feed(0, "\r\xe2\x96\x88\xe2\x96\x88 2/4");  // two U+2588 blocks
  CHECK(c.take() == "\r[r0]: \xe2\x96\x88\xe2\x96\x88 2/4");
  c.feed(1, "\rab");
  CHECK(c.take() == "\r[r1]: ab" + std::string(4, ' '));  // 12 columns before, 8 now
  CHECK(ConsoleMux::visible("ab\r\xe2\x96\x88") == "\xe2\x96\x88" "b");
  CHECK(ConsoleMux::visible("plain") == "plain");
  CHECK(ConsoleMux::visible("x\r") == "x");
}

TEST_CASE("stdout and stderr on different files keep their own lines", "[console]") {
  Console c(false);
  c.feed(0, "\rbar", 2);
  c.feed(1, "line\n", 1);
  REQUIRE(c.out.size() == 2);
  CHECK(c.out[0].fd == 2);
  CHECK(c.out[0].bytes == "\r[r0]: bar");
  CHECK(c.out[1].fd == 1);
  CHECK(c.out[1].bytes == "[r1]: line\n");  // no "\r" over stderr's bar: another file
}

TEST_CASE("an unprefixed console (--no_prefix) writes the bytes a terminal would show", "[console]") {
  ConsoleMux mux(true);
  std::vector<ConsoleMux::Write> out;
  const ConsoleMux::Clock::time_point t{};
  mux.feed(7, 1, "", "a\n\r1%", t, out);
  REQUIRE(out.size() == 2);
  CHECK(out[0].bytes == "a\n");
  CHECK(out[1].bytes == "\r1%");
}

TEST_CASE("the end of a stream ends its line; a very long line is cut", "[console]") {
  Console c;
  c.feed(0, "no newline");
  c.mux.close(0, c.t, c.out);
  CHECK(c.take() == "[r0]: no newline\n");
  CHECK_FALSE(c.mux.next_due());
  c.feed(1, std::string(ConsoleMux::kMaxLine + 5, 'x'));
  const std::string cut = c.take();
  CHECK(cut == "[r1]: " + std::string(ConsoleMux::kMaxLine, 'x') + "\n");
}

TEST_CASE("the rank that reads the terminal prefixes what follows a shown prompt", "[console]") {
  ConsoleMux mux(true);
  std::vector<ConsoleMux::Write> out;
  ConsoleMux::Clock::time_point t{};
  auto take = [&] {
    std::string s;
    for (auto& w : out) s += w.bytes;
    out.clear();
    return s;
  };
  mux.feed(0, 1, "[r0]: ", "(Pdb) ", t, out, true);
  t += ConsoleMux::kPartialHold;
  mux.flush_due(t, out);
  CHECK(take() == "[r0]: (Pdb) ");
  mux.feed(0, 1, "[r0]: ", "41\n(Pdb) ", t, out, true);  // after the user's Enter
  CHECK(take() == "[r0]: 41\n");
  t += ConsoleMux::kPartialHold;
  mux.flush_due(t, out);
  CHECK(take() == "[r0]: (Pdb) ");
  mux.feed(0, 1, "[r0]: ", "--Return--", t, out, true);
  t += ConsoleMux::kPartialHold;
  mux.flush_due(t, out);
  CHECK(take() == "[r0]: --Return--");
}
