#include <catch2/catch.hpp>
#include <cerrno>

#include "ddprun/launcher/options.h"
#include "ddprun/launcher/output.h"
#include "ddprun/launcher/signal_names.h"
#include "ddprun/launcher/summary.h"

using namespace ddprun::launcher;

TEST_CASE("console prefix names the global rank, and the node when multi-node", "[output]") {
  CHECK(console_prefix(0, 3, false) == "[r3]: ");
  CHECK(console_prefix(1, 11, true) == "[n1 r11]: ");
}

TEST_CASE("a log line prefix template renders as Python's safe_substitute", "[output]") {
  const LinePrefixFields f{12, 3, "trainer", "r12i0n8"};
  CHECK(render_line_prefix("${hostname}:${rank}: ", f) == "r12i0n8:12: ");
  CHECK(render_line_prefix("[${role_name}${local_rank}]:", f) == "[trainer3]:");
  CHECK(render_line_prefix("$rank-$local_rank ", f) == "12-3 ");
  // $$ is one $; unknown names, an unclosed brace and a lone $ stay as written.
  CHECK(render_line_prefix("$$rank $ranks ${nope} ${rank $", f) == "$rank $ranks ${nope} ${rank $");
  CHECK(render_line_prefix("", f).empty());
}

TEST_CASE("options: --log_line_prefix_template, its variable, and --shutdown_timeout's", "[output]") {
  auto parse = [](std::vector<std::string> argv, EnvMap env = {}) {
    argv.insert(argv.begin(), "ddprun");
    argv.insert(argv.end(), {"--no_python", "true"});
    return parse_command_line(argv, env, SystemInfo{});
  };
  auto p = parse({"--role=t", "--log-line-prefix-template=${rank}> "});
  REQUIRE(p.options);
  CHECK(p.options->output.line_prefix.text == "${rank}> ");
  CHECK(p.options->output.line_prefix.role == "t");
  p = parse({}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${rank}>"}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}});
  REQUIRE(p.options);
  CHECK(p.options->output.line_prefix.text == "<${rank}>");
  CHECK(p.options->faults.shutdown_timeout_s == 7.0);
  p = parse({"--shutdown_timeout=5", "--log_line_prefix_template="}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}});
  REQUIRE(p.options);
  CHECK(p.options->faults.shutdown_timeout_s == 5.0);
  CHECK(p.options->output.line_prefix.text.empty());
}

TEST_CASE("--print_completion prints the bash completion and starts nothing", "[output]") {
  auto p = parse_command_line({"ddprun", "--print-completion", "bash"}, {}, SystemInfo{});
  CHECK(p.exit_code == 0);
  CHECK(p.message.find("complete -o bashdefault -o default -F _ddprun_complete ddprun") != std::string::npos);
  p = parse_command_line({"ddprun", "--print_completion=zsh"}, {}, SystemInfo{});
  CHECK(p.exit_code == 2);
  CHECK(p.message.find("--print_completion=bash") != std::string::npos);
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

TEST_CASE("duplicate filter: any needle as a substring, as torchrun", "[output]") {
  DuplicateFilter none;
  CHECK_FALSE(none.enabled());
  CHECK_FALSE(none.applies_to(kStreamBoth, kStreamOut, true));

  DuplicateFilter f({"apple", "orange"});
  CHECK(f.enabled());
  CHECK(f.matches("an apple a day"));
  CHECK(f.matches("orange"));
  CHECK_FALSE(f.matches("Apple"));  // case-sensitive
  CHECK_FALSE(f.matches("pear"));
  // An empty needle (a given empty value) matches every line, as Python's `"" in line`.
  DuplicateFilter all({""});
  CHECK(all.matches(""));
  CHECK(all.matches("anything"));
}

TEST_CASE("duplicate filter: only tee'd streams shown on the console", "[output]") {
  DuplicateFilter f({"x"});
  CHECK(f.applies_to(kStreamOut, kStreamOut, true));
  CHECK(f.applies_to(kStreamBoth, kStreamErr, true));
  CHECK_FALSE(f.applies_to(kStreamErr, kStreamOut, true));   // stdout not tee'd
  CHECK_FALSE(f.applies_to(kStreamNone, kStreamOut, true));  // redirect-only or plain console
  CHECK_FALSE(f.applies_to(kStreamBoth, kStreamOut, false)); // --local_ranks_filter hides it
}

TEST_CASE("missing module hint names the interpreter and PYTHON_EXEC", "[output]") {
  std::deque<std::string> tail{"Traceback (most recent call last):", "  File \"t.py\", line 1, in <module>",
                               "ModuleNotFoundError: No module named 'torch'"};
  const std::string hint = missing_module_hint(tail, "/usr/bin/python3 (Python 3.11.2)");
  CHECK(hint.find("/usr/bin/python3 (Python 3.11.2)") != std::string::npos);
  CHECK(hint.find("PYTHON_EXEC") != std::string::npos);
  CHECK_FALSE(missing_module_hint({"ImportError: No module named foo"}, "py").empty());  // Python 2 style
  CHECK(missing_module_hint({"ValueError: bad"}, "py").empty());
  CHECK(missing_module_hint(tail, "").empty());  // not a Python worker
}

TEST_CASE("a failing log file is warned about once, and the warnings are bounded", "[output]") {
  LogWriteFailures f;
  CHECK_FALSE(f.any());
  const std::string first = f.record("/logs/a/0/stdout.log", ENOSPC, 100);
  CHECK_THAT(first, Catch::Contains("/logs/a/0/stdout.log"));
  CHECK_THAT(first, Catch::Contains("ENOSPC"));
  CHECK(f.record("/logs/a/0/stdout.log", ENOSPC, 50).empty());  // the same file: counted, quiet
  CHECK(f.record("/logs/a/0/stdout.log", EIO, 7).empty());
  CHECK_THAT(f.record("/logs/a/0/stderr.log", EIO, 1), Catch::Contains("EIO"));
  CHECK(f.files() == 2);
  CHECK(f.bytes_lost() == 158);
  // Past kMaxWarnings files: one closing line, then silence; every file still counted.
  for (size_t i = 2; i < LogWriteFailures::kMaxWarnings; ++i)
    CHECK_FALSE(f.record("/logs/f" + std::to_string(i), ENOSPC, 1).empty());
  CHECK_THAT(f.record("/logs/over", ENOSPC, 1), Catch::Contains("listed in the summary only"));
  CHECK(f.record("/logs/over2", ENOSPC, 1).empty());
  CHECK(f.files() == LogWriteFailures::kMaxWarnings + 2);
}

TEST_CASE("the summary says which lines only the file has, and claims the console got every line only when it did",
          "[output]") {
  using Kind = LogWriteFailures::Console::Kind;
  LogWriteFailures teed;
  teed.record("/logs/0/stdout.log", ENOSPC, 10, {Kind::Every});
  teed.record("/logs/1/stdout.log", ENOSPC, 10, {Kind::From, 0});  // failed at its first line: the same
  CHECK(teed.console_note() == "the console got every line");
  for (const auto& line : teed.summary_lines()) CHECK_THAT(line, !Catch::Contains("only"));

  LogWriteFailures redirected;
  redirected.record("/logs/0/stderr.log", ENOSPC, 300, {Kind::From, 1234});
  redirected.record("/logs/0/stderr.log", ENOSPC, 50, {Kind::From, 2000});  // the first failure decides
  CHECK_THAT(redirected.console_note(),
             !Catch::Contains("got every line") && Catch::Contains("from its file's first failure on"));
  auto lines = redirected.summary_lines();
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::Contains("350 bytes not written") &&
                           Catch::Contains("lines 1-1234 of the stream are in this file only") &&
                           Catch::Contains("the console has every line from line 1235 on"));

  LogWriteFailures hidden;
  const std::string warning = hidden.record("/logs/3/stdout.log", ENOSPC, 5, {Kind::None});
  CHECK_THAT(warning, Catch::Contains("--local_ranks_filter") && Catch::Contains("lost"));
  CHECK_THAT(hidden.summary_lines()[0], Catch::Contains("not on the console either"));
  CHECK_THAT(hidden.console_note(), !Catch::Contains("got every line"));

  SummaryInput in;
  in.exit_code = 0;
  in.log_losses = redirected.summary_lines();
  in.log_files_failed = redirected.files();
  in.log_bytes_lost = redirected.bytes_lost();
  in.log_console_note = redirected.console_note();
  const std::string text = format_summary(in);
  CHECK_THAT(text, Catch::Contains("LOGS INCOMPLETE") && !Catch::Contains("the console got every line") &&
                       Catch::Contains("lines 1-1234"));
}

TEST_CASE("the summary lists the files that lost most first, bounded", "[output]") {
  LogWriteFailures f;
  f.record("/small", ENOSPC, 1);
  f.record("/big", ENOSPC, 1000);
  auto lines = f.summary_lines();
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[0], Catch::StartsWith("/big: ENOSPC"));
  CHECK_THAT(lines[0], Catch::Contains("1000 bytes not written"));
  for (int i = 0; i < 20; ++i) f.record("/more" + std::to_string(i), EIO, 0);
  lines = f.summary_lines();
  CHECK(lines.size() == LogWriteFailures::kMaxSummaryFiles + 1);
  CHECK(lines.back() == "... and 12 more");
}
