// What an agent (or a server) says is checked before it is stored or printed. Every field of
// the agents' protocol comes from a peer that may lie, run old code, or be a stranger: sizes
// must stay in bounds (a local world size of 2^31-1 once gave real workers WORLD_SIZE=-2^31+1),
// and text must not drive the terminal (ANSI escapes) or pose as ddprun's own lines.
//
// Pure; never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ddprun/rdzv/agent_protocol.h"

namespace ddprun::rdzv {

// Bounds of the protocol's numbers. The launcher's own flags stay within them (options.cpp).
inline constexpr int64_t kMaxLocalWorldSize = 1 << 16;
inline constexpr int64_t kMaxNodes = 1 << 20;
inline constexpr int64_t kMaxRestarts = 1 << 20;
// A round's world size, all nodes together: far below INT32_MAX, so no sum overflows an int.
inline constexpr int64_t kMaxWorldSize = 1 << 24;
inline constexpr int64_t kMaxTimeoutMs = 10'000'000'000;  // --rdzv_conf timeouts cap at 1e7 s

// Bounds of the protocol's text, in bytes.
inline constexpr size_t kMaxRunIdLen = 128;
inline constexpr size_t kMaxNameLen = 255;   // node_id, host
inline constexpr size_t kMaxShortLen = 64;   // signal, when
inline constexpr size_t kMaxTailLen = 8192;  // a failure's stderr tail
inline constexpr size_t kMaxReasonLen = 4096;  // RESTART/JOB_FAILED reasons, ERROR messages
// Round::store_peers: room for every address of a round whose workers' store an agent hosts
// (within one agent frame). A round whose addresses do not fit keeps its store on the server:
// some 49,000 nodes of one IPv4 address each fit, 8,192 of two IPv6 addresses at worst.
inline constexpr size_t kMaxStorePeersLen = 768 * 1024;

// `s` made safe to print: ANSI escape sequences (CSI, OSC, two-byte ESC sequences) and the C1
// controls removed; other control bytes and invalid UTF-8 become '?'; at most `max_bytes`
// bytes (cut at a character boundary, "..." marking the cut). `multiline` keeps '\n' (a tab
// becomes a space either way); without it a newline becomes ' ', so the text is one line.
std::string printable(std::string_view s, size_t max_bytes, bool multiline = false);

// A name that travels as an identity (run id, node id, host): 1..max_len bytes of printable
// ASCII (0x20..0x7e; `allow_space` false: 0x21..0x7e). Refused rather than repaired.
bool is_clean_name(std::string_view s, size_t max_len, bool allow_space = false);

// Why the server must refuse this JOIN, or nullopt when every field is in bounds.
std::optional<std::string> check_join(const Join& j);

// A failure report with its text made printable and its numbers in range (out of range: -1).
Failure sanitized(Failure f);

// Why an agent must not act on this ROUND (its own local world size `local_world_size`),
// or nullopt. A server that is wrong or fake must not yield a negative WORLD_SIZE.
std::optional<std::string> check_round(const Round& r, int64_t local_world_size);

}  // namespace ddprun::rdzv
