#include <catch2/catch.hpp>

#include "ddprun/launcher/output.h"
#include "ddprun/launcher/signal_names.h"

using namespace ddprun::launcher;

TEST_CASE("console prefix names the global rank, and the node when multi-node", "[output]") {
  CHECK(console_prefix(0, 3, false) == "[r3]: ");
  CHECK(console_prefix(1, 11, true) == "[n1 r11]: ");
}

TEST_CASE("lines are split across reads", "[output]") {
  LineSplitter s;
  std::vector<std::string> lines;
  s.feed("hel", lines);
  CHECK(lines.empty());
  s.feed("lo\nwor", lines);
  CHECK(lines == std::vector<std::string>{"hello"});
  s.feed("ld\r\n\nlast", lines);
  CHECK(lines == std::vector<std::string>{"hello", "world", ""});
  std::string rest;
  REQUIRE(s.flush(rest));
  CHECK(rest == "last");
  CHECK_FALSE(s.flush(rest));
}

TEST_CASE("long lines are cut to the bound", "[output]") {
  LineSplitter s(4);
  std::vector<std::string> lines;
  s.feed("abcdefghij\nxy", lines);
  CHECK(lines == std::vector<std::string>{"abcd", "efgh", "ij"});
  s.feed("zw", lines);
  CHECK(lines.size() == 3);
  s.feed("q\n", lines);
  CHECK(lines == std::vector<std::string>{"abcd", "efgh", "ij", "xyzw", "q"});
  LineSplitter exact(4);
  std::vector<std::string> e;
  exact.feed("abcd\n", e);
  CHECK(e == std::vector<std::string>{"abcd"});
}

TEST_CASE("tail keeps the last lines, bounded", "[output]") {
  TailBuffer t(3, 5);
  for (const char* l : {"1", "2", "3", "4", "0123456789"}) t.push(l);
  CHECK(std::vector<std::string>(t.lines().begin(), t.lines().end()) ==
        std::vector<std::string>{"3", "4", "01234"});
}

TEST_CASE("signal names", "[output]") {
  CHECK(signal_name(9) == "SIGKILL");
  CHECK(signal_name(11) == "SIGSEGV");
  CHECK(signal_name(99) == "signal 99");
  CHECK(signal_from_name("sigterm") == 15);
  CHECK(signal_from_name("HUP") == 1);
  CHECK(signal_from_name("3") == 3);
  CHECK_FALSE(signal_from_name("SIGFOO"));
  CHECK_FALSE(signal_from_name("99999"));
}
