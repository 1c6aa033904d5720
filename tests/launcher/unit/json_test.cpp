// JSON read from elsewhere (json.h) and the status snapshot written and read through it: text
// that is not UTF-8, control characters, numbers past 2^53, the nesting limit.
#include <catch2/catch.hpp>

#include <cstdint>

#include <nlohmann/json.hpp>

#include "ddprun/launcher/agent_status.h"
#include "ddprun/launcher/json.h"

using namespace ddprun::launcher;

namespace {
std::string nested(int n) {
  return std::string(static_cast<size_t>(n), '[') + std::string(static_cast<size_t>(n), ']');
}
}  // namespace

TEST_CASE("json: numbers keep their value past 2^53; literals and strings decoded", "[json]") {
  auto j = parse_untrusted_json(R"({"a": 9007199254740993, "b": -9223372036854775808, "c": 18446744073709551615,
                         "d": 2.5e3, "e": true, "f": null, "g": "x\u00e9\ud83d\ude00\n"})");
  REQUIRE(j);
  CHECK((*j)["a"].get<int64_t>() == 9007199254740993);
  CHECK((*j)["b"].get<int64_t>() == INT64_MIN);
  CHECK((*j)["c"].get<uint64_t>() == UINT64_MAX);
  CHECK((*j)["d"].get<double>() == 2500.0);
  CHECK((*j)["e"] == true);
  CHECK((*j)["f"].is_null());
  CHECK((*j)["g"] == "x\xc3\xa9\xf0\x9f\x98\x80\n");
}

TEST_CASE("json: nesting of 64 levels below the top is read, deeper is refused", "[json]") {
  CHECK(parse_untrusted_json(nested(65)));
  CHECK_FALSE(parse_untrusted_json(nested(66)));
  CHECK_FALSE(parse_untrusted_json(std::string(1000000, '[')));
  for (const std::string bad : {"", "{", "[1,]", "{\"a\" 1}", "\"\\x\"", "01", "1 2", "nul", "\"a\nb\""}) {
    INFO(bad);
    std::string error;
    CHECK_FALSE(parse_untrusted_json(bad, &error));
    CHECK_FALSE(error.empty());
  }
}

TEST_CASE("json: bytes that are not UTF-8 are read as U+FFFD and quoted as U+FFFD", "[json]") {
  auto j = parse_untrusted_json("{\"k\\u0001\": \"bad \xff\xfe end\", \"t\": \"cut \xe2\x82\"}");
  REQUIRE(j);
  CHECK((*j)["k\x01"] == "bad \xef\xbf\xbd\xef\xbf\xbd end");
  CHECK((*j)["t"] == "cut \xef\xbf\xbd");
  CHECK(dump_json(nlohmann::json("a\"b\\c\n\x01\x7f\xff")) == "\"a\\\"b\\\\c\\n\\u0001\\u007f\xef\xbf\xbd\"");
}

TEST_CASE("json: a status answer with text that is not UTF-8 is still one a strict reader takes", "[json]") {
  AgentStatus s;
  s.run_id = "job\xff";
  s.host = "node\xc3";
  s.state = "running";
  s.last_failure = "r0: \x1b[2J \xfe";
  s.last_failure_rank = 0;
  const std::string text = status_document_json({s});
  nlohmann::json doc;
  REQUIRE_NOTHROW(doc = nlohmann::json::parse(text));
  CHECK(doc["agents"][0]["run_id"] == "job\xef\xbf\xbd");
  CHECK(doc["agents"][0]["last_failure"]["what"] == "r0: \x1b[2J \xef\xbf\xbd");
  // And an answer another writer sent with such bytes is read with U+FFFD in their place.
  std::string error;
  auto back =
      status_from_json("{\"run_id\":\"j\xff\",\"node_rank\":0,\"agent_pid\":9,\"attempt\":0,\"ranks\":[]}", &error);
  REQUIRE(back);
  CHECK(back->run_id == "j\xef\xbf\xbd");
}
