// The agents' rendezvous protocol: ddprun's own extension, served on the same port as the
// TCPStore protocol. A connection announces it with 00 + kAgentMagic (as a D2 client sends
// 00 + the VALIDATE magic), then exchanges frames:
//
//   u32 payload length | u8 message type | u64 n | n x (blob field name, blob field value)
//
// Every field is a string (numbers in decimal), so messages can grow without breaking old
// peers. Pure: no sockets; never throws on network bytes.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "ddprun/wire/codec.h"

namespace ddprun::rdzv {

inline constexpr uint32_t kAgentMagic = 0x52504444u;  // "DDPR" little-endian
inline constexpr uint32_t kMaxFrameBytes = 1 << 20;
inline constexpr uint64_t kMaxFields = 256;

enum class MsgType : uint8_t {
  // agent -> server
  Join = 1,       // run_id, node_id, host, local_world_size, min_nodes, max_nodes, last_call_ms,
                  // join_timeout_ms, max_restarts, heartbeat_timeout_ms, [node_rank] (static), [prefer_rank0]
  Heartbeat = 2,
  Failure = 3,    // round, global_rank, local_rank, host, exit_code, signal, message, stderr_tail
  Succeeded = 4,  // round
  Leave = 5,
  // server -> agent
  Round = 20,     // round, restart_count, node_rank, nnodes, world_size, base_rank, local_world_sizes
                  // (comma list), hosts (comma list), store_port
  Restart = 21,   // reason, restart_count (what the next round will carry)
  JobDone = 22,
  JobFailed = 23,  // reason, [first failure fields]
  Error = 24,      // message (the join was refused or timed out)
};
const char* msg_type_name(MsgType t);

struct Message {
  MsgType type = MsgType::Heartbeat;
  std::map<std::string, std::string> fields;

  const std::string& get(const std::string& k) const;  // "" when absent
  int64_t get_int(const std::string& k, int64_t fallback = 0) const;
  Message& set(const std::string& k, std::string v) {
    fields[k] = std::move(v);
    return *this;
  }
  Message& set(const std::string& k, int64_t v) { return set(k, std::to_string(v)); }
};

// Appends one frame to `out`.
void encode_message(const Message& m, std::string& out);

// Parses one frame from the start of `buf` (Ok / NeedMore with need_total / Bad with error).
wire::ParseResult parse_message(std::span<const uint8_t> buf, Message& out);

}  // namespace ddprun::rdzv
