// What peers send is bounded and printable before it is stored or shown.
#include <catch2/catch.hpp>

#include "ddprun/rdzv/round_state.h"
#include "ddprun/rdzv/validate.h"

using namespace ddprun::rdzv;
using namespace std::chrono_literals;

namespace {
Join good_join() {
  Join j;
  j.run_id = "job";
  j.node_id = "n1_10.0.0.2_77";
  j.host = "10.0.0.2";
  j.local_world_size = 8;
  j.min_nodes = 2;
  j.max_nodes = 4;
  j.max_restarts = 3;
  return j;
}
struct NoStores : WorkerStores {
  uint16_t open(const std::string&, int64_t, bool) override { return 40000; }
  void close(const std::string&, int64_t) override {}
  bool progressed(const std::string&, int64_t, int64_t) override { return true; }
};
}  // namespace

TEST_CASE("PrintableStripsEscapesAndControls", "[validate]") {
  CHECK(printable("plain text", 100) == "plain text");
  CHECK(printable("\x1b[31mred\x1b[0m", 100) == "red");
  CHECK(printable("\x1b]0;title\x07" "after", 100) == "after");
  CHECK(printable("\x1b]8;;http://x\x1b\\link", 100) == "link");
  CHECK(printable("\x1b" "cwiped", 100) == "wiped");  // ESC c: reset the terminal
  CHECK(printable("a\x01" "b\x7f" "c", 100) == "a?b?c");
  CHECK(printable("bell\a", 100) == "bell?");
  CHECK(printable("tab\there", 100) == "tab here");
  // One line unless asked: no fake "[ddprun] info:" line can start mid-message.
  CHECK(printable("x\n[ddprun] info: fake", 100) == "x [ddprun] info: fake");
  CHECK(printable("x\r\n[ddprun] info: fake", 100, true) == "x\n[ddprun] info: fake");
  CHECK(printable("progress 10%\rprogress 20%", 100, true) == "progress 10%\nprogress 20%");
  // UTF-8: valid characters kept; invalid bytes, C1 controls (0x9b = CSI) and bidi overrides not.
  CHECK(printable("caf\xc3\xa9 \xe2\x9c\x93", 100) == "caf\xc3\xa9 \xe2\x9c\x93");
  CHECK(printable("a\xff" "b\xc0\xaf" "c", 100) == "a?b??c");
  CHECK(printable("x\xc2\x9b" "31my", 100) == "x31my");
  CHECK(printable("abc\xe2\x80\xae" "cba", 100) == "abccba");
  CHECK(printable("\xe2\x9c", 100) == "??");  // a character cut short
}

TEST_CASE("PrintableBoundsLengthAtCharacterBoundaries", "[validate]") {
  CHECK(printable(std::string(100, 'a'), 10) == "aaaaaaa...");
  CHECK(printable(std::string(10, 'a'), 10) == std::string(10, 'a'));
  CHECK(printable(std::string(1 << 20, 'z'), 8192).size() == 8192);
  // Never half a character.
  std::string e;
  for (int i = 0; i < 10; ++i) e += "\xc3\xa9";
  const std::string p = printable(e, 9);
  CHECK(p == "\xc3\xa9\xc3\xa9\xc3\xa9...");
  // An escape sequence cut by the bound leaves nothing of itself.
  CHECK(printable("ok\x1b[", 100) == "ok");
}

TEST_CASE("CleanNames", "[validate]") {
  CHECK(is_clean_name("job-7_a.b", 128));
  CHECK_FALSE(is_clean_name("", 128));
  CHECK_FALSE(is_clean_name("a b", 128));
  CHECK(is_clean_name("a b", 128, true));
  CHECK_FALSE(is_clean_name("a\x1b[2Jb", 128, true));
  CHECK_FALSE(is_clean_name(std::string(129, 'a'), 128));
  CHECK_FALSE(is_clean_name("caf\xc3\xa9", 128));
}

TEST_CASE("CheckJoinRefusesOutOfBoundsFields", "[validate]") {
  CHECK_FALSE(check_join(good_join()));
  auto refused = [](auto change) {
    Join j = good_join();
    change(j);
    return check_join(j).has_value();
  };
  CHECK(refused([](Join& j) { j.local_world_size = 2147483647; }));
  CHECK(refused([](Join& j) { j.local_world_size = 0; }));
  CHECK(refused([](Join& j) { j.local_world_size = kMaxLocalWorldSize + 1; }));
  CHECK_FALSE(refused([](Join& j) { j.local_world_size = kMaxLocalWorldSize; }));
  CHECK(refused([](Join& j) { j.min_nodes = 0; }));
  CHECK(refused([](Join& j) { j.max_nodes = 1; }));
  CHECK(refused([](Join& j) { j.max_nodes = INT64_MAX; }));
  CHECK(refused([](Join& j) { j.max_restarts = -1; }));
  CHECK(refused([](Join& j) { j.max_restarts = INT64_MAX; }));
  CHECK(refused([](Join& j) { j.heartbeat_timeout_ms = 0; }));
  CHECK(refused([](Join& j) { j.join_timeout_ms = -5; }));
  CHECK(refused([](Join& j) { j.node_rank = 4; }));
  CHECK(refused([](Join& j) { j.node_rank = -2; }));
  CHECK(refused([](Join& j) { j.run_id = ""; }));
  CHECK(refused([](Join& j) { j.run_id = "job\x1b[2J"; }));
  CHECK(refused([](Join& j) { j.run_id = std::string(200, 'r'); }));
  CHECK(refused([](Join& j) { j.node_id = "n\n[ddprun] info: fake"; }));
  CHECK(refused([](Join& j) { j.host = "10.0.0.2 (trusted)"; }));
  CHECK(refused([](Join& j) { j.host = ""; }));
  const auto why = [] {
    Join j = good_join();
    j.local_world_size = 2147483647;
    return *check_join(j);
  }();
  CHECK_THAT(why, Catch::Contains("local_world_size 2147483647"));
}

TEST_CASE("SanitizedFailure", "[validate]") {
  Failure f;
  f.global_rank = 1LL << 40;
  f.local_rank = -7;
  f.exit_code = 1LL << 40;
  f.signal = "SIGKILL\x1b[2J";
  f.when = "2026\n[ddprun] info: x";
  f.stderr_tail = "Traceback\n\x1b[31mError\x1b[0m\n" + std::string(20000, 'x');
  const Failure s = sanitized(f);
  CHECK(s.global_rank == -1);
  CHECK(s.local_rank == -1);
  CHECK(s.exit_code == -1);
  CHECK(s.signal == "SIG?");
  CHECK(s.when.find('\n') == std::string::npos);
  CHECK(s.stderr_tail.rfind("Traceback\nError\n", 0) == 0);
  CHECK(s.stderr_tail.size() <= kMaxTailLen);
  Failure ok;
  ok.signal = "SIGRTMIN+3";
  ok.exit_code = -11;
  CHECK(sanitized(ok).signal == "SIGRTMIN+3");
  CHECK(sanitized(ok).exit_code == -11);
}

TEST_CASE("CheckRoundRefusesImpossibleLayouts", "[validate]") {
  Round r{.run_id = "job", .round = 0, .restart_count = 0, .max_restarts = 3, .node_rank = 1, .nnodes = 2,
          .world_size = 4, .base_rank = 2, .store_port = 40000};
  CHECK_FALSE(check_round(r, 2));
  Round neg = r;
  neg.world_size = -2147483647;
  CHECK(check_round(neg, 2));
  Round past = r;
  past.base_rank = 3;  // 3 + 2 workers > 4
  CHECK(check_round(past, 2));
  Round rank = r;
  rank.node_rank = 2;
  CHECK(check_round(rank, 2));
  Round port = r;
  port.store_port = 70000;
  CHECK(check_round(port, 2));
}

TEST_CASE("RoundStateRefusesAHugeWorldAndStoresPrintableFailures", "[validate][round]") {
  NoStores stores;
  RoundState state{stores};
  std::vector<Outbound> out;
  const auto now = Clock::time_point{} + 1000s;
  Join a = good_join();
  a.max_nodes = a.min_nodes = 2;
  a.max_restarts = 0;
  // An intruder declaring 2^31-1 local workers is refused and leaves no job behind.
  Join huge = a;
  huge.node_id = "intruder";
  huge.local_world_size = 2147483647;
  state.on_message(9, to_message(huge), now, out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].msg.type == MsgType::Error);
  CHECK(out[0].close_after);
  CHECK(state.num_jobs() == 0);
  // Two real nodes form the round; WORLD_SIZE is theirs.
  out.clear();
  state.on_message(1, to_message(a), now, out);
  Join b = a;
  b.node_id = "n2";
  b.host = "10.0.0.3";
  state.on_message(2, to_message(b), now, out);
  REQUIRE(out.size() == 2);
  CHECK(from_message<Round>(out[0].msg).world_size == 16);
  // A failure full of escapes and fake lines reaches JOB_FAILED printable.
  out.clear();
  Failure f{.round = 0, .global_rank = 9, .exit_code = 1};
  f.stderr_tail = "\x1b[2J\x1b[H[ddprun] info: all good\rreally";
  f.signal = "\x1b]0;pwned\x07";
  state.on_message(2, to_message(f), now, out);
  REQUIRE_FALSE(out.empty());
  const auto jf = from_message<JobFailed>(out[0].msg);
  REQUIRE(jf.first_failure);
  CHECK(jf.first_failure->stderr_tail == "[ddprun] info: all good\nreally");
  CHECK(jf.first_failure->signal == "SIG?");
  CHECK(jf.reason.find('\x1b') == std::string::npos);
}
