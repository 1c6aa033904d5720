// --log_format=json: the line's schema, escaping and values (launcher/README.md "JSON logs").
#include <catch2/catch.hpp>

#include <chrono>
#include <limits>

#include <nlohmann/json.hpp>

#include "ddprun/launcher/log_format.h"
#include "ddprun/launcher/options.h"

#include <spdlog/pattern_formatter.h>

using namespace ddprun::launcher;

namespace {
std::chrono::system_clock::time_point at(int64_t us) {
  return std::chrono::system_clock::time_point(std::chrono::microseconds(us));
}
}  // namespace

TEST_CASE("A JSON log line has every member of the schema, in order", "[logformat]") {
  LogRecord r;
  r.time = at(1764780000123456);  // 2025-12-03T16:40:00.123456Z
  r.level = "warning";
  r.host = "node-7";
  r.node_rank = 3;
  r.rank = 25;
  r.event = "worker_failed";
  r.message = "worker r25 failed";
  std::vector<LogField> f{{"exit_code", int64_t{1}},
                          {"after_s", 2.5},
                          {"config_error", false},
                          {"signal", std::string("SIGKILL")}};
  r.fields = &f;
  CHECK(json_log_line(r) ==
        "{\"time\":\"2025-12-03T16:40:00.123456Z\",\"level\":\"warning\",\"host\":\"node-7\",\"node\":3,\"rank\":25,"
        "\"event\":\"worker_failed\",\"message\":\"worker r25 failed\",\"fields\":{\"exit_code\":1,\"after_s\":2.5,"
        "\"config_error\":false,\"signal\":\"SIGKILL\"}}\n");
}

TEST_CASE("A line without node, rank or event says null and \"log\"", "[logformat]") {
  LogRecord r;
  r.time = at(0);
  r.level = "info";
  r.host = "h";
  r.message = "m";
  CHECK(json_log_line(r) ==
        "{\"time\":\"1970-01-01T00:00:00.000000Z\",\"level\":\"info\",\"host\":\"h\",\"node\":null,\"rank\":null,"
        "\"event\":\"log\",\"message\":\"m\",\"fields\":{}}\n");
}

TEST_CASE("Strings are escaped; bytes that are not UTF-8 become U+FFFD; a line stays one line", "[logformat]") {
  LogRecord r;
  r.time = at(0);
  r.level = "error";
  r.host = "h";
  const std::string msg =
      std::string("quote \" back \\ nl \n cr \r tab \t bell \x07 del \x7f caf\xc3\xa9 bad \xff end") +
      std::string(1, '\0') + "z";
  r.message = msg;
  std::vector<LogField> f{{"k\"ey", std::string("line1\nline2")}, {"nan", std::numeric_limits<double>::quiet_NaN()}};
  r.fields = &f;
  const std::string line = json_log_line(r);
  CHECK(line.find("\"message\":\"quote \\\" back \\\\ nl \\n cr \\r tab \\t bell \\u0007 del \\u007f caf\xc3\xa9 bad "
                  "\xef\xbf\xbd end\\u0000z\"") != std::string::npos);
  CHECK(line.find("\"k\\\"ey\":\"line1\\nline2\"") != std::string::npos);
  CHECK(line.find("\"nan\":null") != std::string::npos);
  CHECK(line.find('\n') == line.size() - 1);
  // Truncated and overlong sequences are not UTF-8 either: a truncated one is one U+FFFD (as
  // Unicode recommends), each byte of an overlong one another.
  r.message = "\xe2\x82";  // first two bytes of a three-byte sequence
  CHECK(json_log_line(r).find("\"message\":\"\xef\xbf\xbd\"") != std::string::npos);
  r.message = "\xc0\xaf";  // an overlong '/'
  CHECK(json_log_line(r).find("\"message\":\"\xef\xbf\xbd\xef\xbf\xbd\"") != std::string::npos);
}

TEST_CASE("Every JSON log line reads back with a strict UTF-8 reader, keys and values alike", "[logformat]") {
  LogRecord r;
  r.time = at(0);
  r.level = "error";
  r.host = "h\xfe";
  const std::string msg = std::string("bad \xff\xc3 ctl \x01\x1b[31m \b\f") + std::string(1, '\0');
  r.message = msg;
  std::vector<LogField> f{{"k\xff", std::string("v\x80")},
                          {"big", int64_t{9007199254740993}},
                          {"inf", std::numeric_limits<double>::infinity()}};
  r.fields = &f;
  const std::string line = json_log_line(r);
  CHECK(line.find('\n') == line.size() - 1);
  nlohmann::json doc;
  REQUIRE_NOTHROW(doc = nlohmann::json::parse(line));
  CHECK(doc["host"] == "h\xef\xbf\xbd");
  CHECK(doc["message"] == std::string("bad \xef\xbf\xbd\xef\xbf\xbd ctl \x01\x1b[31m \b\f") + std::string(1, '\0'));
  CHECK(doc["fields"]["k\xef\xbf\xbd"] == "v\xef\xbf\xbd");
  CHECK(doc["fields"]["big"].get<int64_t>() == 9007199254740993);
  CHECK(doc["fields"]["inf"].is_null());
}

TEST_CASE("--log_format takes text or json", "[logformat]") {
  CHECK(parse_log_format("text") == LogFormat::Text);
  CHECK(parse_log_format("json") == LogFormat::Json);
  CHECK_FALSE(parse_log_format("JSON"));
  CHECK_FALSE(parse_log_format(""));
  auto parsed = parse_command_line({"ddprun", "--log_format=yaml", "--no_python", "true"}, {},
                                   SystemInfo{.cpu_count = 8, .gpu_count = 0});
  REQUIRE_FALSE(parsed.options);
  CHECK(parsed.exit_code == 2);
  CHECK(parsed.message.find("log_format") != std::string::npos);
  CHECK(parsed.message.find("text or json") != std::string::npos);
  parsed = parse_command_line({"ddprun", "--log-format", "json", "--no_python", "true"}, {},
                              SystemInfo{.cpu_count = 8, .gpu_count = 0});
  REQUIRE(parsed.options);
  CHECK(parsed.options->output.log_format == LogFormat::Json);
  parsed = parse_command_line({"ddprun", "--no_python", "true"}, {{"PET_LOG_FORMAT", "json"}},
                              SystemInfo{.cpu_count = 8, .gpu_count = 0});
  REQUIRE(parsed.options);
  CHECK(parsed.options->output.log_format == LogFormat::Json);
}

TEST_CASE("--log_timestamps: text lines begin with the local time; off by default", "[logformat]") {
  const SystemInfo sys{.cpu_count = 8, .gpu_count = 0};
  auto parsed = parse_command_line({"ddprun", "--no_python", "true"}, {}, sys);
  REQUIRE(parsed.options);
  CHECK_FALSE(parsed.options->output.log_timestamps);
  parsed = parse_command_line({"ddprun", "--log-timestamps", "--no_python", "true"}, {}, sys);
  INFO(parsed.message);
  REQUIRE(parsed.options);
  CHECK(parsed.options->output.log_timestamps);
  parsed = parse_command_line({"ddprun", "--no_python", "true"}, {{"PET_LOG_TIMESTAMPS", "1"}}, sys);
  REQUIRE(parsed.options);
  CHECK(parsed.options->output.log_timestamps);

  // The spdlog line and a printed block carry the same stamp format.
  spdlog::pattern_formatter plain(text_log_pattern(false)), stamped(text_log_pattern(true));
  const spdlog::details::log_msg msg("ddprun", spdlog::level::warn, "the store is slow");
  spdlog::memory_buf_t a, b;
  plain.format(msg, a);
  stamped.format(msg, b);
  CHECK(fmt::to_string(a) == "[ddprun] warning: the store is slow\n");
  const std::string line = fmt::to_string(b);
  const std::string stamp = local_time_text(msg.time);
  CHECK(line.size() > stamp.size());
  CHECK(line.substr(0, 11) == stamp.substr(0, 11));  // the date, then the time to the millisecond
  CHECK(line.find(" [ddprun] warning: the store is slow\n") == stamp.size());

  const auto t = std::chrono::system_clock::from_time_t(1800000000) + std::chrono::milliseconds(7);
  const std::string s = local_time_text(t);
  REQUIRE(s.size() == 23);
  CHECK(s.substr(19) == ".007");
  CHECK(stamp_lines("a\nb\n", "T") == "T a\nT b\n");
  CHECK(stamp_lines("last", "T") == "T last");
  CHECK(stamp_lines("", "T").empty());
}
