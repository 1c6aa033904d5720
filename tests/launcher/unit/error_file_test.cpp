#include <catch2/catch.hpp>

#include "ddprun/launcher/error_file.h"

using namespace ddprun::launcher;

TEST_CASE("PyTorch's @record format: message, traceback, timestamp", "[errorfile]") {
  const std::string content = R"({"message": {"message": "RuntimeError: boom \u00e9",
    "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3\nRuntimeError: boom",
                  "timestamp": "1732890000"}}})";
  auto r = parse_error_file(content);
  CHECK(r.valid_json);
  CHECK(r.message == "RuntimeError: boom \xc3\xa9");
  CHECK(r.traceback.find("Traceback (most recent call last):\n  File \"t.py\"") == 0);
  CHECK(r.timestamp == "1732890000");
  CHECK(r.raw.empty());
  auto text = format_error_file(r);
  CHECK_THAT(text, Catch::Contains("message: RuntimeError: boom"));
  CHECK_THAT(text, Catch::Contains("    Traceback (most recent call last):"));
  CHECK_THAT(text, Catch::Contains("    RuntimeError: boom"));
}

TEST_CASE("message as a plain string", "[errorfile]") {
  auto r = parse_error_file(R"({"message": "CUDA error: out of memory", "rank": 3})");
  CHECK(r.message == "CUDA error: out of memory");
  CHECK(r.raw.empty());
}

TEST_CASE("other JSON is shown as is", "[errorfile]") {
  auto r = parse_error_file(R"({"error": [1, 2.5e3, true, null], "nested": {"a": "b"}})");
  CHECK(r.valid_json);
  CHECK(r.message.empty());
  CHECK_THAT(r.raw, Catch::Contains("\"error\""));
  CHECK_THAT(format_error_file(r), Catch::StartsWith("  content: "));
}

TEST_CASE("not JSON: shown raw, never throws", "[errorfile]") {
  for (const std::string bad :
       {"", "{", "{\"message\": ", "[1,2", "\"abc", "{\"a\":\"\\x\"}", "not json at all", "{\"a\": 1} trailing"}) {
    INFO(bad);
    auto r = parse_error_file(bad);
    CHECK_FALSE(r.valid_json);
    CHECK(r.message.empty());
  }
  auto r = parse_error_file("plain text\n");
  CHECK(r.raw == "plain text");
  CHECK_THAT(format_error_file(r), Catch::Contains("not JSON"));
}

TEST_CASE("deep nesting and huge content stay bounded", "[errorfile]") {
  std::string deep(100000, '[');
  CHECK_FALSE(parse_error_file(deep).valid_json);
  std::string big = "{\"message\": \"" + std::string(100000, 'x') + "\"}";
  auto r = parse_error_file(big);
  CHECK(r.message.size() == 100000);
  CHECK(format_error_file(r).size() < 5000);
}

TEST_CASE("an error file that is not UTF-8 is read, its bad bytes as U+FFFD", "[errorfile]") {
  const std::string content = "{\"message\": {\"message\": \"RuntimeError: bad \xff\xfe byte\", \"extraInfo\": "
                              "{\"py_callstack\": \"tb \xc3\", \"timestamp\": \"1\"}}}";
  auto r = parse_error_file(content);
  CHECK(r.valid_json);
  CHECK(r.message == "RuntimeError: bad \xef\xbf\xbd\xef\xbf\xbd byte");
  CHECK(r.traceback == "tb \xef\xbf\xbd");
  CHECK(r.timestamp == "1");
}

TEST_CASE("error file edge cases: control characters, big numbers, the nesting limit", "[errorfile]") {
  auto r = parse_error_file(
      R"({"message": {"message": "a\u0001b\u001b[0m\ud83d\ude00", "extraInfo": {"timestamp": 9007199254740993}}})");
  CHECK(r.message == "a\x01"
                     "b\x1b[0m\xf0\x9f\x98\x80");
  CHECK(r.timestamp == "9007199254740993");
  r = parse_error_file(R"({"message": {"message": "m", "extraInfo": {"timestamp": 18446744073709551615}}})");
  CHECK(r.timestamp == "18446744073709551615");
  // 64 levels below the top one are read; one more is refused.
  const auto nested = [](int n) {
    return "{\"message\": \"deep\", \"d\": " + std::string(static_cast<size_t>(n), '[') +
           std::string(static_cast<size_t>(n), ']') + "}";
  };
  CHECK(parse_error_file(nested(64)).message == "deep");
  CHECK_FALSE(parse_error_file(nested(65)).valid_json);
}

TEST_CASE("a configuration error is exit code 78 with ConfigError in the error file, both", "[errorfile]") {
  const std::string config =
      R"({"message": {"message": "ConfigError: DDP: the ranks built different models", "extraInfo": {}}})";
  const std::string other = R"({"message": {"message": "Error: something else", "extraInfo": {}}})";
  CHECK(says_config_error(78, false, &config));
  CHECK_FALSE(says_config_error(78, false, &other));   // a script's own exit 78
  CHECK_FALSE(says_config_error(78, false, nullptr));  // no error file
  CHECK_FALSE(says_config_error(1, false, &config));
  CHECK_FALSE(says_config_error(78, true, &config));  // killed by signal 78? never a config error
  const std::string junk = "ConfigError: not JSON";
  CHECK_FALSE(says_config_error(78, false, &junk));
}
