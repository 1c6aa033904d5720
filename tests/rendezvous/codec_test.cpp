#include <catch2/catch.hpp>

#include "ddprun/wire/codec.h"

using namespace ddprun::wire;

namespace {
std::span<const uint8_t> bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }
std::string hex_bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}
}  // namespace

TEST_CASE("SetRequestMatchesPyTorch211Capture", "[codec]") {
  // Captured from PyTorch 2.11: SET "/k1" = "v1".
  const std::string wire =
      hex_bytes({0x01, 3, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6b, 0x31, 2, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31});
  Request r;
  auto res = parse_request(bytes(wire), Dialect::D2, Limits{}, r);
  REQUIRE(res.status == ParseStatus::Ok);
  CHECK(res.consumed == wire.size());
  CHECK(r.op == Op::Set);
  CHECK(r.keys.at(0) == "/k1");
  CHECK(r.values.at(0) == "v1");
  std::string out;
  REQUIRE(encode_request(Dialect::D2, r, out));
  CHECK(out == wire);
}

TEST_CASE("AddInitCaptureBothDialects", "[codec]") {
  std::string d2 = hex_bytes({0x04, 5, 0, 0, 0, 0, 0, 0, 0, 'i', 'n', 'i', 't', '/', 1, 0, 0, 0, 0, 0, 0, 0});
  std::string d0 = d2;
  d0[0] = 0x03;
  for (auto [wire, d] : {std::pair{d2, Dialect::D2}, std::pair{d0, Dialect::D0}}) {
    Request r;
    auto res = parse_request(bytes(wire), d, Limits{}, r);
    REQUIRE(res.status == ParseStatus::Ok);
    CHECK(r.op == Op::Add);
    CHECK(r.keys.at(0) == "init/");
    CHECK(r.number == 1);
  }
}

TEST_CASE("EveryPrefixOfARequestNeedsMore", "[codec]") {
  Request r;
  r.op = Op::CompareSet;
  r.keys = {"/torch.rendezvous.job"};
  r.values = {"", "Y2FuaW1hZGFt"};
  std::string wire;
  REQUIRE(encode_request(Dialect::D2, r, wire));
  for (size_t n = 0; n < wire.size(); ++n) {
    Request out;
    auto res = parse_request(bytes(wire.substr(0, n)), Dialect::D2, Limits{}, out);
    REQUIRE(res.status == ParseStatus::NeedMore);
    CHECK(res.need_total > n);
    CHECK(res.need_total <= wire.size());
  }
  Request out;
  auto res = parse_request(bytes(wire + "garbage"), Dialect::D2, Limits{}, out);
  REQUIRE(res.status == ParseStatus::Ok);
  CHECK(res.consumed == wire.size());
  CHECK(out.values == r.values);
}

TEST_CASE("RoundTripOfEveryOpInEveryDialect", "[codec]") {
  for (Dialect d : {Dialect::D0, Dialect::D1, Dialect::D2}) {
    for (int o = 0; o <= static_cast<int>(Op::WatchKey); ++o) {
      Request r;
      r.op = static_cast<Op>(o);
      r.keys = {"a"};
      r.values = {"x", "y"};
      r.number = -7;
      r.u32 = 0x01020304;
      if (r.op == Op::MultiSet) r.values = {"x"};
      if (r.op == Op::Check || r.op == Op::Wait || r.op == Op::MultiGet) r.keys = {"a", "", "ccc"};
      std::string wire;
      if (!encode_request(d, r, wire)) {
        CHECK_FALSE(code_for_op(d, r.op).has_value());
        continue;
      }
      Request back;
      auto res = parse_request(bytes(wire), d, Limits{}, back);
      INFO(dialect_name(d) << " " << op_name(r.op));
      REQUIRE(res.status == ParseStatus::Ok);
      CHECK(back.op == r.op);
      CHECK(res.consumed == wire.size());
    }
  }
}

TEST_CASE("LegacyCodesSevenAndEightFollowTheDialect", "[codec]") {
  CHECK(op_from_code(Dialect::D0, 7) == Op::WatchKey);
  CHECK(op_from_code(Dialect::D0, 8) == Op::DeleteKey);
  CHECK(op_from_code(Dialect::D1, 7) == Op::DeleteKey);
  CHECK(op_from_code(Dialect::D1, 8) == Op::Append);
  CHECK(op_from_code(Dialect::D0, 11) == Op::CancelWait);  // only 2.1 sends it
  CHECK(op_from_code(Dialect::D2, 12) == Op::CancelWait);
  CHECK(op_from_code(Dialect::D2, 18) == Op::Barrier);
  CHECK_FALSE(op_from_code(Dialect::D2, 19).has_value());
  CHECK_FALSE(op_from_code(Dialect::D1, 12).has_value());
}

TEST_CASE("UnknownCommandIsBad", "[codec]") {
  Request r;
  auto res = parse_request(bytes(hex_bytes({0x63})), Dialect::D2, Limits{}, r);
  CHECK(res.status == ParseStatus::Bad);
  CHECK_THAT(res.error, Catch::Contains("unknown command byte 99"));
}

TEST_CASE("AbsurdLengthPrefixIsBadWithoutAllocating", "[codec]") {
  Request r;
  std::string wire = hex_bytes({0x03, 0, 0, 0, 0, 0, 0, 0, 0x10});  // GET, key length 2^60
  auto res = parse_request(bytes(wire), Dialect::D2, Limits{}, r);
  CHECK(res.status == ParseStatus::Bad);
  CHECK_THAT(res.error, Catch::Contains("exceeds the limit"));
}

TEST_CASE("KeyOverTheLimitIsBad", "[codec]") {
  Limits lim;
  lim.max_key_len = 4;
  Request r;
  r.op = Op::Get;
  r.keys = {"12345"};
  std::string wire;
  encode_request(Dialect::D2, r, wire);
  CHECK(parse_request(bytes(wire), Dialect::D2, lim, r).status == ParseStatus::Bad);
  lim.max_key_len = 5;
  CHECK(parse_request(bytes(wire), Dialect::D2, lim, r).status == ParseStatus::Ok);
}

TEST_CASE("TooManyKeysIsBad", "[codec]") {
  std::string wire = hex_bytes({0x06});
  Writer(wire).u64(uint64_t(1) << 40);
  Request r;
  CHECK(parse_request(bytes(wire), Dialect::D2, Limits{}, r).status == ParseStatus::Bad);
}

TEST_CASE("DialectDetection", "[codec]") {
  auto d2 = detect_dialect(bytes(hex_bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x0D})), Dialect::D0, Limits{});
  CHECK(d2.status == ParseStatus::Ok);
  CHECK(d2.dialect == Dialect::D2);
  CHECK(d2.consumed == 5);
  CHECK(detect_dialect(bytes(hex_bytes({0x00, 0xCE})), Dialect::D0, Limits{}).status == ParseStatus::NeedMore);
  auto legacy = detect_dialect(bytes(hex_bytes({0x03, 5, 0})), Dialect::D0, Limits{});
  CHECK(legacy.dialect == Dialect::D0);
  CHECK(legacy.consumed == 0);
  auto legacy_set = detect_dialect(bytes(hex_bytes({0x00, 3, 0, 0, 0, 0, 0, 0, 0})), Dialect::D1, Limits{});
  CHECK(legacy_set.dialect == Dialect::D1);
  CHECK(legacy_set.consumed == 0);
  auto wrong_magic = detect_dialect(bytes(hex_bytes({0x00, 0xEF, 0xBE, 0xAD, 0xDE})), Dialect::D0, Limits{});
  CHECK(wrong_magic.status == ParseStatus::Bad);
}

TEST_CASE("ProtocolSniffing: the agents' announcement, TCPStore dialects, undecided", "[codec]") {
  const std::string hello = hex_bytes({0x00, 0x44, 0x44, 0x50, 0x52, 0x07});  // 00 "DDPR" + a message
  const auto agent_hello = bytes(hello);
  auto agent = sniff_protocol(agent_hello, true, Dialect::D0, Limits{});
  CHECK(agent.status == ParseStatus::Ok);
  CHECK(agent.protocol == Protocol::Agent);
  CHECK(agent.consumed == 5);
  // Where agents are not served, the same bytes are a legacy SET with an absurd key length.
  CHECK(sniff_protocol(agent_hello, false, Dialect::D0, Limits{}).status == ParseStatus::Bad);
  const std::string validate = hex_bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C});
  auto d2 = sniff_protocol(bytes(validate), true, Dialect::D0, Limits{});
  CHECK(d2.protocol == Protocol::TcpStore);
  CHECK(d2.dialect == Dialect::D2);
  CHECK(d2.consumed == 5);
  const std::string get = hex_bytes({0x03, 5, 0});
  auto legacy = sniff_protocol(bytes(get), true, Dialect::D1, Limits{});
  CHECK(legacy.protocol == Protocol::TcpStore);
  CHECK(legacy.dialect == Dialect::D1);
  CHECK(legacy.consumed == 0);
  const std::string part = hex_bytes({0x00, 0x44, 0x44});
  auto undecided = sniff_protocol(bytes(part), true, Dialect::D0, Limits{});
  CHECK(undecided.status == ParseStatus::NeedMore);
  CHECK(undecided.protocol == Protocol::Unknown);
}

TEST_CASE("RandomBytesNeverCrashTheParser", "[codec][fuzz]") {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  Limits lim;
  lim.max_request_bytes = 1 << 20;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string buf;
    size_t n = (x >> 7) % 64;
    for (size_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      buf.push_back(static_cast<char>(i == 0 ? x % 20 : (x % 4 == 0 ? 0 : x & 0xff)));
    }
    Request r;
    for (Dialect d : {Dialect::D0, Dialect::D1, Dialect::D2}) {
      auto res = parse_request(bytes(buf), d, lim, r);
      if (res.status == ParseStatus::Ok) CHECK(res.consumed <= buf.size());
      if (res.status == ParseStatus::NeedMore) CHECK(res.need_total > buf.size());
    }
  }
}

// The framer must agree with parse_request on where every request ends, byte by byte as it
// arrives, and reject a lying length as soon as the prefix is there.
TEST_CASE("FramerAgreesWithParserOnEveryPrefix", "[codec][framer]") {
  std::vector<Request> reqs(6);
  reqs[0].op = Op::CompareSet, reqs[0].keys = {"/job"}, reqs[0].values = {"", "abc"};
  reqs[1].op = Op::MultiSet, reqs[1].keys = {"/a", "/bb", "/ccc"}, reqs[1].values = {"1", "", "333"};
  reqs[2].op = Op::Add, reqs[2].keys = {"init/"}, reqs[2].number = 1;
  reqs[3].op = Op::MultiGet, reqs[3].keys = {"/a", "/b"};
  reqs[4].op = Op::Ping, reqs[4].u32 = 7;
  reqs[5].op = Op::ListKeys;
  for (const auto& r : reqs) {
    std::string wire;
    REQUIRE(encode_request(Dialect::D2, r, wire));
    RequestFramer f;
    for (size_t n = 0; n < wire.size(); ++n) {
      auto res = f.scan(bytes(wire.substr(0, n)), Dialect::D2, Limits{});
      REQUIRE(res.status == ParseStatus::NeedMore);
      CHECK(res.need_total > n);
      CHECK(res.need_total <= wire.size());
    }
    auto res = f.scan(bytes(wire + "next"), Dialect::D2, Limits{});
    REQUIRE(res.status == ParseStatus::Ok);
    CHECK(res.consumed == wire.size());
    Request back;
    CHECK(parse_request(bytes(wire), Dialect::D2, Limits{}, back).status == ParseStatus::Ok);
  }
}

TEST_CASE("FramerRefusesLiesAtTheirPrefix", "[codec][framer]") {
  Limits lim;
  lim.max_request_bytes = 1000 * 1000;
  std::string huge_value = hex_bytes({0x01, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 0, 0, 0, 0, 0, 0, 0, 0x10});  // 2^60
  RequestFramer f;
  auto res = f.scan(bytes(huge_value), Dialect::D2, lim);
  REQUIRE(res.status == ParseStatus::Bad);
  CHECK(res.error.find("value length") != std::string::npos);
  // A count whose minimal encoding passes the request limit: refused before any key arrives.
  std::string count = hex_bytes({0x0A, 0, 0, 2, 0, 0, 0, 0, 0});  // 128 Ki keys x 8 bytes > 10^6
  f.reset();
  res = f.scan(bytes(count), Dialect::D2, lim);
  CHECK(res.status == ParseStatus::Bad);
  f.reset();
  CHECK(f.scan(bytes(hex_bytes({200})), Dialect::D2, lim).status == ParseStatus::Bad);
  // Fields that fit one by one but not together.
  std::string wire;
  Request r;
  r.op = Op::MultiSet;
  for (int i = 0; i < 3; ++i)
    r.keys.push_back("k" + std::to_string(i)), r.values.push_back(std::string(400 * 1024, 'v'));
  REQUIRE(encode_request(Dialect::D2, r, wire));
  f.reset();
  res = f.scan(bytes(wire), Dialect::D2, lim);
  REQUIRE(res.status == ParseStatus::Bad);
  CHECK(res.error.find("request larger than the limit") != std::string::npos);
}

// Resuming: feeding one large request in many pieces walks each length prefix once (the
// framer's position only moves forward), unlike re-parsing from the start.
TEST_CASE("FramerResumesWhereItStopped", "[codec][framer]") {
  Request r;
  r.op = Op::MultiGet;
  for (int i = 0; i < 1000; ++i) r.keys.push_back("/key" + std::to_string(i));
  std::string wire;
  REQUIRE(encode_request(Dialect::D2, r, wire));
  RequestFramer f;
  size_t calls = 0, have = 0;
  ParseResult res;
  while (true) {
    res = f.scan(bytes(wire.substr(0, have)), Dialect::D2, Limits{});
    ++calls;
    if (res.status != ParseStatus::NeedMore) break;
    REQUIRE(res.need_total > have);
    have = res.need_total;  // deliver exactly what it asked for
  }
  REQUIRE(res.status == ParseStatus::Ok);
  CHECK(res.consumed == wire.size());
  CHECK(calls <= 2 * r.keys.size() + 3);
}

TEST_CASE("StepParserAgreesWithParserStepByStep", "[codec][steps]") {
  // Each step parses about step_bytes of the request; together they give what parse_request
  // gives, for the ops that name a list of keys and for the others (parsed whole at once).
  Request wait{.op = Op::Wait}, mset{.op = Op::MultiSet}, set{.op = Op::Set, .keys = {"/k"}, .values = {"v"}};
  for (int i = 0; i < 300; ++i) {
    wait.keys.push_back("/wait/" + std::to_string(i) + std::string(i % 40, 'w'));
    mset.keys.push_back("/set/" + std::to_string(i));
    mset.values.push_back(std::string(i % 70, 'v'));
  }
  for (const Request& req : {wait, mset, set}) {
    std::string wire;
    REQUIRE(encode_request(Dialect::D2, req, wire));
    const size_t step_bytes = GENERATE(1, 100, 4096, 1 << 20);
    StepParser parser;
    Request out;
    ParseResult res;
    int steps = 0;
    do {
      res = parser.step(bytes(wire), Dialect::D2, Limits{}, out, step_bytes);
      ++steps;
      REQUIRE(steps <= 1000);
    } while (res.status == ParseStatus::Partial);
    REQUIRE(res.status == ParseStatus::Ok);
    CHECK(res.consumed == wire.size());
    CHECK(parser.parsed_bytes() <= wire.size());
    CHECK(out.op == req.op);
    CHECK(out.keys == req.keys);
    CHECK(out.values == req.values);
    if (req.keys.size() > 1) CHECK(steps >= static_cast<int>(wire.size() / (step_bytes + 8 + 110)));
    if (req.keys.size() > 1 && step_bytes == 1) CHECK(steps == static_cast<int>(req.keys.size()));
  }
}

TEST_CASE("StepParserRefusesWhatParseRequestRefuses", "[codec][steps]") {
  Limits lim;
  lim.max_keys = 4;
  Request wait{.op = Op::Wait, .keys = {"a", "b", "c", "d", "e"}};
  std::string wire;
  REQUIRE(encode_request(Dialect::D2, wait, wire));
  StepParser parser;
  Request out;
  CHECK(parser.step(bytes(wire), Dialect::D2, lim, out, 1).status == ParseStatus::Bad);
  StepParser unknown;
  CHECK(unknown.step(bytes(hex_bytes({0x7f})), Dialect::D2, Limits{}, out, 1).status == ParseStatus::Bad);
}
