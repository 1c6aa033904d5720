#include "ddprun/wire/mux.h"

#include <algorithm>

namespace ddprun::wire::mux {

namespace {
void append_header(std::string& out, uint32_t channel, Kind kind, uint32_t len) {
  Writer w(out);
  w.u32(channel).u8(static_cast<uint8_t>(kind)).u32(len);
}
}  // namespace

void append_hello(std::string& out) { Writer(out).u8(0).u32(kMuxMagic); }

void append_frame(std::string& out, uint32_t channel, Kind kind, std::span<const uint8_t> bytes) {
  if (kind != Kind::Data) {
    append_header(out, channel, kind, 0);
    return;
  }
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), kMaxPayload);
    append_header(out, channel, kind, static_cast<uint32_t>(n));
    out.append(reinterpret_cast<const char*>(bytes.data()), n);
    bytes = bytes.subspan(n);
  }
}

Decoded decode_frame(std::span<const uint8_t> buf) {
  Decoded d;
  if (buf.size() < kHeaderSize) return d;
  const uint32_t channel = load_u32(buf.data());
  const uint8_t kind = buf[4];
  const uint32_t len = load_u32(buf.data() + 5);
  d.status = ParseStatus::Bad;
  if (kind < static_cast<uint8_t>(Kind::Open) || kind > static_cast<uint8_t>(Kind::Close)) {
    d.bad = "a relay frame of an unknown kind";
  } else if (channel == 0) {
    d.bad = "a relay frame of channel 0";
  } else if (len > kMaxPayload) {
    d.bad = "a relay frame longer than its limit";
  } else if (kind != static_cast<uint8_t>(Kind::Data) && len != 0) {
    d.bad = "a relay OPEN or CLOSE frame with a payload";
  } else if (kind == static_cast<uint8_t>(Kind::Data) && len == 0) {
    d.bad = "an empty relay DATA frame";
  } else if (buf.size() < kHeaderSize + len) {
    d.status = ParseStatus::NeedMore;
    d.need_total = kHeaderSize + len;
  } else {
    d.status = ParseStatus::Ok;
    d.frame = {channel, static_cast<Kind>(kind), buf.subspan(kHeaderSize, len)};
    d.consumed = kHeaderSize + len;
  }
  return d;
}

Verdict judge(Kind kind, bool open, size_t open_channels) {
  if (kind == Kind::Open) {
    if (open) return Verdict::Bad;
    return open_channels < kMaxSessions ? Verdict::Accept : Verdict::Refuse;
  }
  return open ? Verdict::Accept : Verdict::Ignore;
}

}  // namespace ddprun::wire::mux
