// The relay's multiplexed connection: many TCPStore clients' bytes over one connection to the
// store (a node's store relay, relay/store_relay.h). Pure bytes in, frames out; no sockets.
//
// The connection starts with 00 + kMuxMagic (as an agent's starts with 00 + its magic: no
// TCPStore dialect begins so, the u32 being neither VALIDATE's magic nor a plausible key length).
// Then frames, each a 9-byte header {u32 channel, u8 kind, u32 length} (little-endian) and
// `length` bytes. OPEN starts a channel (a client connected), DATA carries its bytes either way,
// unparsed, and CLOSE ends it either way (as a closed socket would). Byte-level format:
// docs/PROTOCOL.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ddprun/wire/codec.h"

namespace ddprun::wire::mux {

inline constexpr uint32_t kMuxMagic = 0x584D5044u;  // "DPMX" little-endian
inline constexpr size_t kHelloSize = 5;
inline constexpr size_t kHeaderSize = 9;
// The largest payload of one frame; longer bytes are sent as several DATA frames.
inline constexpr uint32_t kMaxPayload = 256 * 1024;
// Channels open at once on one multiplexed connection (a node's workers).
inline constexpr size_t kMaxSessions = 4096;

enum class Kind : uint8_t { Open = 1, Data = 2, Close = 3 };

// 00 + kMuxMagic: the first bytes of a multiplexed connection.
void append_hello(std::string& out);
// One OPEN or CLOSE frame, or the DATA frames of `bytes` (several past kMaxPayload; none for none).
void append_frame(std::string& out, uint32_t channel, Kind kind, std::span<const uint8_t> bytes = {});
inline void append_data(std::string& out, uint32_t channel, std::string_view bytes) {
  append_frame(out, channel, Kind::Data, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

struct Frame {
  uint32_t channel = 0;
  Kind kind = Kind::Data;
  std::span<const uint8_t> payload;  // points into the decoded buffer
};

struct Decoded {
  ParseStatus status = ParseStatus::NeedMore;  // Ok, NeedMore or Bad
  Frame frame;
  size_t consumed = 0;    // Ok: the frame's bytes
  size_t need_total = 0;  // NeedMore: bytes the frame needs in all, when its header is known
  const char* bad = "";   // Bad: why
};
// The frame at the start of `buf`. Bad: an unknown kind, a payload past kMaxPayload, an OPEN or
// CLOSE with a payload, an empty DATA, or channel 0.
Decoded decode_frame(std::span<const uint8_t> buf);

// What a side does with a frame, given whether its channel is open and how many are.
enum class Verdict {
  Accept,  // OPEN of a new channel (room left), DATA or CLOSE of an open one
  Ignore,  // DATA or CLOSE of a channel this side closed already (the frames crossed)
  Refuse,  // OPEN past kMaxSessions: answer CLOSE for that channel, the others go on
  Bad,     // OPEN of a channel that is open: the peer is broken, close the connection
};
Verdict judge(Kind kind, bool open, size_t open_channels);

}  // namespace ddprun::wire::mux
