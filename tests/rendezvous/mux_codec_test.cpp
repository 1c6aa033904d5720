// The store relay's frames (wire/mux.h): pure bytes, no sockets.
#include <catch2/catch.hpp>

#include "ddprun/wire/codec.h"
#include "ddprun/wire/mux.h"

using namespace ddprun::wire;
namespace mux = ddprun::wire::mux;

namespace {
std::span<const uint8_t> bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }
std::string text(std::span<const uint8_t> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }
std::string header(uint32_t channel, uint8_t kind, uint32_t len) {
  std::string s;
  Writer(s).u32(channel).u8(kind).u32(len);
  return s;
}
}  // namespace

TEST_CASE("MuxHelloIsTheirOwnProtocolOnEveryListener", "[mux]") {
  std::string hello;
  mux::append_hello(hello);
  REQUIRE(hello.size() == mux::kHelloSize);
  for (bool agents : {true, false}) {
    auto s = sniff_protocol(bytes(hello), agents, Dialect::D0, Limits{});
    CHECK(s.status == ParseStatus::Ok);
    CHECK(s.protocol == Protocol::Mux);
    CHECK(s.consumed == mux::kHelloSize);
  }
  // Four bytes of it decide nothing yet; a legacy SET of a short key is still TCPStore.
  CHECK(sniff_protocol(bytes(hello.substr(0, 4)), false, Dialect::D0, Limits{}).status == ParseStatus::NeedMore);
  const std::string legacy_set = std::string(1, '\0') + header(3, 0, 0).substr(0, 4);
  CHECK(sniff_protocol(bytes(legacy_set), false, Dialect::D0, Limits{}).protocol == Protocol::TcpStore);
}

TEST_CASE("MuxFramesMergedAndSplit", "[mux]") {
  std::string wire;
  mux::append_frame(wire, 7, mux::Kind::Open);
  mux::append_data(wire, 7, "abc");
  mux::append_frame(wire, 7, mux::Kind::Close);
  // Merged: three frames from one buffer.
  std::span<const uint8_t> rest = bytes(wire);
  std::vector<mux::Frame> got;
  while (!rest.empty()) {
    auto d = mux::decode_frame(rest);
    REQUIRE(d.status == ParseStatus::Ok);
    got.push_back(d.frame);
    rest = rest.subspan(d.consumed);
  }
  REQUIRE(got.size() == 3);
  CHECK(got[0].kind == mux::Kind::Open);
  CHECK((got[1].kind == mux::Kind::Data && got[1].channel == 7 && text(got[1].payload) == "abc"));
  CHECK(got[2].kind == mux::Kind::Close);
  // Split: every prefix of the DATA frame asks for more, with its total once the header is in.
  const std::string data = wire.substr(mux::kHeaderSize, mux::kHeaderSize + 3);
  for (size_t n = 0; n < data.size(); ++n) {
    auto d = mux::decode_frame(bytes(data.substr(0, n)));
    CHECK(d.status == ParseStatus::NeedMore);
    CHECK(d.need_total == (n < mux::kHeaderSize ? 0 : mux::kHeaderSize + 3));
  }
}

TEST_CASE("MuxLongDataIsSeveralFrames", "[mux]") {
  const std::string big(mux::kMaxPayload * 2 + 5, 'x');
  std::string wire;
  mux::append_data(wire, 1, big);
  CHECK(wire.size() == big.size() + 3 * mux::kHeaderSize);
  std::string joined;
  std::span<const uint8_t> rest = bytes(wire);
  while (!rest.empty()) {
    auto d = mux::decode_frame(rest);
    REQUIRE(d.status == ParseStatus::Ok);
    joined += text(d.frame.payload);
    rest = rest.subspan(d.consumed);
  }
  CHECK(joined == big);
  std::string none;
  mux::append_data(none, 1, "");
  CHECK(none.empty());
}

TEST_CASE("MuxBadFrames", "[mux]") {
  auto bad = [](const std::string& w) { return mux::decode_frame(bytes(w)).status == ParseStatus::Bad; };
  CHECK(bad(header(1, 0, 0)));                             // unknown kind
  CHECK(bad(header(1, 4, 0)));
  CHECK(bad(header(0, 1, 0)));                             // channel 0
  CHECK(bad(header(1, 2, mux::kMaxPayload + 1)));          // oversize, told from the header alone
  CHECK(bad(header(1, 1, 1) + "x"));                       // OPEN with a payload
  CHECK(bad(header(1, 3, 2) + "xy"));                      // CLOSE with a payload
  CHECK(bad(header(1, 2, 0)));                             // empty DATA
  CHECK(!bad(header(1, 2, mux::kMaxPayload)));             // the limit itself: needs more
}

TEST_CASE("MuxSessionBounds", "[mux]") {
  using mux::Kind, mux::Verdict;
  CHECK(mux::judge(Kind::Open, false, 0) == Verdict::Accept);
  CHECK(mux::judge(Kind::Open, false, mux::kMaxSessions - 1) == Verdict::Accept);
  CHECK(mux::judge(Kind::Open, false, mux::kMaxSessions) == Verdict::Refuse);
  CHECK(mux::judge(Kind::Open, true, 1) == Verdict::Bad);
  CHECK(mux::judge(Kind::Data, true, 1) == Verdict::Accept);
  CHECK(mux::judge(Kind::Close, true, 1) == Verdict::Accept);
  CHECK(mux::judge(Kind::Data, false, 1) == Verdict::Ignore);
  CHECK(mux::judge(Kind::Close, false, 0) == Verdict::Ignore);
}
