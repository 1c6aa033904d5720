// The command lines of `ddprun status` and `ddprun dump`: flags, values, help, errors.
#include <catch2/catch.hpp>

#include "ddprun/launcher/subcommand_args.h"

using namespace ddprun::launcher;

TEST_CASE("status: every flag, as --under_score, --dash-ed and --flag=value", "[subcommands]") {
  auto p = parse_status_args({"--json", "--watch", "--interval", "2.5", "--rdzv-id=job", "--rdzv_endpoint", "head:1",
                              "--rdzv-token-file", "/t"});
  REQUIRE(p.args);
  CHECK(p.args->json);
  CHECK(p.args->watch);
  CHECK(p.args->interval_s == 2.5);
  CHECK(p.args->run_id == "job");
  CHECK(p.args->endpoint == "head:1");
  CHECK(p.args->token_file == "/t");
  p = parse_status_args({});
  REQUIRE(p.args);
  CHECK_FALSE(p.args->json);
  CHECK(p.args->interval_s == 1.0);
  CHECK_FALSE(p.args->run_id);
  // An empty value is the empty value, not the next argument.
  p = parse_status_args({"--rdzv_id=", "--json"});
  REQUIRE(p.args);
  CHECK(p.args->run_id == "");
  CHECK(p.args->json);
}

TEST_CASE("status: --help lists the flags; bad command lines are one line and exit 2", "[subcommands]") {
  auto p = parse_status_args({"--watch", "-h"});
  REQUIRE_FALSE(p.args);
  CHECK(p.exit_code == 0);
  for (const char* flag :
       {"--json", "--watch", "--interval", "--rdzv_id", "--rdzv_endpoint", "--rdzv_token_file", "--help"})
    CHECK_THAT(p.message, Catch::Contains(flag));
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--frobnicate"}, "unknown argument --frobnicate (ddprun status --help lists the options)"},
      {{"stray"}, "unknown argument stray"},
      {{"--interval", "0"}, "--interval 0: give seconds, at least 0.1"},
      {{"--interval=abc"}, "--interval abc: give seconds"},
      {{"--rdzv_id"}, "--rdzv_id: 1 required ID missing (ddprun status --help lists the options)"},
      {{"--json=yes"}, "--json takes no value"},
      {{"--watch=false"}, "--watch takes no value"},
      {{"--rdzv_endpoint=h:1"}, "--rdzv_endpoint needs --rdzv_id"},
      {{"--rdzv_token_file=f"}, "--rdzv_token_file goes with --rdzv_endpoint"},
      {{"--bad\n\x1b[2J"}, "unknown argument --bad ?[2J"},
  };
  for (const auto& [args, says] : bad) {
    INFO(args.front());
    p = parse_status_args(args);
    CHECK_FALSE(p.args);
    CHECK(p.exit_code == 2);
    CHECK_THAT(p.message, Catch::Contains(says));
    CHECK(p.message.find('\n') == std::string::npos);
  }
}

TEST_CASE("dump: RUN or none; --help; an unknown option or a second RUN is exit 2", "[subcommands]") {
  auto p = parse_dump_args({});
  REQUIRE(p.args);
  CHECK_FALSE(p.args->run);
  p = parse_dump_args({"job7"});
  REQUIRE(p.args);
  CHECK(p.args->run == "job7");
  p = parse_dump_args({"--", "-odd-name"});
  REQUIRE(p.args);
  CHECK(p.args->run == "-odd-name");
  p = parse_dump_args({"--help"});
  REQUIRE_FALSE(p.args);
  CHECK(p.exit_code == 0);
  CHECK_THAT(p.message, Catch::StartsWith("usage: ddprun dump [RUN]"));
  CHECK_THAT(p.message, Catch::Contains("--help"));
  p = parse_dump_args({"--frobnicate"});
  CHECK(p.exit_code == 2);
  CHECK(p.message == "unknown option --frobnicate");
  p = parse_dump_args({"a", "b"});
  CHECK(p.exit_code == 2);
  CHECK(p.message == "one RUN at most (got a and b)");
}
