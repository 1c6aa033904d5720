// The agents' rendezvous protocol (docs/RENDEZVOUS.md): ddprun's own extension, served on the
// same port as the TCPStore protocol. A connection announces it with 00 + kAgentMagic (as a
// D2 client sends 00 + the VALIDATE magic), then exchanges frames:
//
//   u32 payload length | u8 message type | u64 n | n x (blob field name, blob field value)
//
// Every field travels as a string (numbers in decimal), so messages can grow without breaking
// old peers: an absent field takes its default, an unknown one is ignored.
//
// One struct per message type below; each names its fields once, in its `visit` function,
// which the one encoder (to_message) and the one decoder (from_message) walk. Code outside
// this file reads and writes the structs, never field names. `Message` is the untyped frame
// (the codec's unit, and what tests may inspect).
//
// Pure: no sockets; never throws on network bytes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "ddprun/wire/codec.h"

namespace ddprun::rdzv {

inline constexpr uint32_t kAgentMagic = 0x52504444u;  // "DDPR" little-endian
inline constexpr uint32_t kMaxFrameBytes = 1 << 20;
inline constexpr uint64_t kMaxFields = 256;

enum class MsgType : uint8_t {
  // agent -> server
  Join = 1,
  Heartbeat = 2,
  Failure = 3,
  Succeeded = 4,
  Leave = 5,
  Hello = 6,  // the first message: the agent's nonce (agent_auth.h)
  Auth = 7,   // the agent's proof that it holds the token
  Progress = 8,  // the agent hosting the round's workers' store: all of them joined it
  StatusQuery = 9,  // `ddprun status --rdzv_endpoint`: the agents' status snapshots of a job
  // server -> agent
  Round = 20,
  Restart = 21,
  JobDone = 22,
  JobFailed = 23,
  Error = 24,  // the request was refused or timed out; the server closes the connection
  Challenge = 25,  // the answer to HELLO: whether a token is required, the server's nonce and proof
  Welcome = 26,    // the agent's proof was right: it may join
  StatusReply = 27,  // the answer to STATUS_QUERY
};
const char* msg_type_name(MsgType t);

// The untyped frame.
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

// ---- the messages ----
// Job-wide settings travel in every JOIN; the first joiner's define the job, and a later
// joiner whose settings differ is refused (naming both values).

struct Join {
  static constexpr MsgType kType = MsgType::Join;
  std::string run_id;
  std::string node_id;  // unique per agent
  std::string host;     // the address this node advertises
  int64_t local_world_size = 1;
  // job-wide
  int64_t min_nodes = 1, max_nodes = 1, max_restarts = 0;
  int64_t last_call_ms = 30000, join_timeout_ms = 600000, heartbeat_timeout_ms = 5000;
  // The workers' store of every round is the server's main keyspace on its own port (reset
  // per round) instead of a fresh port per round: static multi-node, where MASTER_PORT must
  // equal --master_port.
  bool fixed_store_port = false;
  // Retry every failure while restarts are left, even one that repeats as a deterministic
  // failure (the same rank, the same way, within seconds, before the workers joined the store).
  bool retry_deterministic = false;
  // per node
  int64_t node_rank = -1;     // static: --node_rank; -1: the server assigns
  bool prefer_rank0 = false;  // this node hosts the endpoint
  // Re-joining a standing server that restarted while this agent's workers run round
  // `resume_round` (-1: a plain join): the round's layout as the agent knows it, so the server
  // rebuilds the round from the agents' re-joins (round_state.h "Resume").
  int64_t resume_round = -1;
  int64_t resume_restart_count = 0;
  int64_t resume_node_rank = -1, resume_nnodes = 0;
  int64_t resume_store_port = 0;
  bool resume_succeeded = false;  // its workers had all exited 0 (SUCCEEDED was sent)
  // The round's workers' store as the agent was told it (Round::store_host; "" = on the server).
  std::string resume_store_host;
  bool resume_progressed = false;  // node rank 0 hosting the store: all workers had joined it
  // This agent's own store server, bound for the round it joins and not yet accepting (0 =
  // none: an older agent, or not offered). When every node of a round offered one, node rank
  // 0's hosts the round's workers' store (Round::store_host), so the workers' store outlives
  // a restart of a standing server.
  int64_t store_offer_port = 0;
  // Filled by the server (whatever the agent sent): the agent's address as the server sees it,
  // which the hosting agent's store admits (as the server's own stores admit its agents).
  std::string seen_from;

  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("run_id", s.run_id), v("node_id", s.node_id), v("host", s.host), v("local_world_size", s.local_world_size);
    v("min_nodes", s.min_nodes), v("max_nodes", s.max_nodes), v("max_restarts", s.max_restarts);
    v("last_call_ms", s.last_call_ms), v("join_timeout_ms", s.join_timeout_ms);
    v("heartbeat_timeout_ms", s.heartbeat_timeout_ms), v("fixed_store_port", s.fixed_store_port);
    v("retry_deterministic", s.retry_deterministic);
    v("node_rank", s.node_rank), v("prefer_rank0", s.prefer_rank0);
    v("resume_round", s.resume_round), v("resume_restart_count", s.resume_restart_count);
    v("resume_node_rank", s.resume_node_rank), v("resume_nnodes", s.resume_nnodes);
    v("resume_store_port", s.resume_store_port), v("resume_succeeded", s.resume_succeeded);
    v("resume_store_host", s.resume_store_host), v("resume_progressed", s.resume_progressed);
    v("store_offer_port", s.store_offer_port), v("seen_from", s.seen_from);
  }
};

// Also carries, every few beats, the agent's status snapshot (`ddprun status`'s JSON for one
// agent, launcher/README.md "ddprun status"), which the server keeps for STATUS_QUERY: "" = no
// new one. At most kMaxStatusBytes; a longer one is dropped.
inline constexpr size_t kMaxStatusBytes = 64 * 1024;
struct Heartbeat {
  static constexpr MsgType kType = MsgType::Heartbeat;
  std::string status;
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("status", s.status);
  }
};

// Any connection that passed the handshake (with a token: one that holds it) may ask for the
// status snapshots the agents of a job last sent; no JOIN needed. The server answers with
// STATUS_REPLY and keeps the connection.
struct StatusQuery {
  static constexpr MsgType kType = MsgType::StatusQuery;
  std::string run_id;
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("run_id", s.run_id);
  }
};

// A worker failure, as the agent reports it; the server adds where it happened and keeps the
// job's first one (sent with JOB_FAILED).
struct Failure {
  static constexpr MsgType kType = MsgType::Failure;
  int64_t round = -1;
  int64_t global_rank = -1, local_rank = -1;
  int64_t exit_code = 0;
  std::string signal;  // "SIGKILL" when killed by a signal, else ""
  std::string when;    // wall time, UTC
  std::string stderr_tail;
  int64_t runtime_ms = -1;  // how long the worker ran (-1: not said, an older agent)
  // The worker said a restart cannot fix it: exit code 78 (EX_CONFIG) and an error file whose
  // message begins with "ConfigError" (libddprun_worker's ConfigError, e.g. ranks whose models
  // differ). Not retried unless the job asked for it (Join::retry_deterministic).
  bool config_error = false;
  // filled by the server
  std::string host, node_id;
  int64_t node_rank = -1;

  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("round", s.round), v("global_rank", s.global_rank), v("local_rank", s.local_rank);
    v("exit_code", s.exit_code), v("signal", s.signal), v("when", s.when), v("stderr_tail", s.stderr_tail);
    v("runtime_ms", s.runtime_ms), v("config_error", s.config_error);
    v("host", s.host), v("node_id", s.node_id), v("node_rank", s.node_rank);
  }
};

struct Succeeded {
  static constexpr MsgType kType = MsgType::Succeeded;
  int64_t round = -1;
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("round", s.round);
  }
};

// From node rank 0's agent when it hosts the round's workers' store (Round::store_host) and
// every worker joined that store (fixed_port_stores.h's progress rule, read where the store is).
struct Progress {
  static constexpr MsgType kType = MsgType::Progress;
  int64_t round = -1;
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("round", s.round);
  }
};

struct Leave {
  static constexpr MsgType kType = MsgType::Leave;
  template <class S, class V>
  static void visit(S&, V&&) {}
};

// O(1) per agent: no per-node lists, so a round of 8192 agents stays small; the one exception
// is store_peers, to node rank 0 alone when it hosts the workers' store.
struct Round {
  static constexpr MsgType kType = MsgType::Round;
  std::string run_id;
  int64_t round = 0, restart_count = 0, max_restarts = 0;
  int64_t node_rank = 0, nnodes = 1, world_size = 1, base_rank = 0;
  int64_t store_port = 0;  // the round's workers' store, on the rendezvous server's address
  // Set when node rank 0's agent hosts the workers' store (Join::store_offer_port): its address
  // (store_port is then the port it offered). "" = on the rendezvous server's address.
  std::string store_host;
  // To node rank 0 hosting the store: the addresses its store admits besides loopback (the
  // round's agents, as the server saw them and as they advertise themselves), comma-separated.
  std::string store_peers;

  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("run_id", s.run_id), v("round", s.round), v("restart_count", s.restart_count);
    v("max_restarts", s.max_restarts), v("node_rank", s.node_rank), v("nnodes", s.nnodes);
    v("world_size", s.world_size), v("base_rank", s.base_rank), v("store_port", s.store_port);
    v("store_host", s.store_host), v("store_peers", s.store_peers);
  }
};

struct Restart {
  static constexpr MsgType kType = MsgType::Restart;
  std::string reason;
  int64_t restart_count = 0;  // what the next round carries
  int64_t round = 0;          // the round that ends
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("reason", s.reason), v("restart_count", s.restart_count), v("round", s.round);
  }
};

struct JobDone {
  static constexpr MsgType kType = MsgType::JobDone;
  int64_t round = 0, restart_count = 0;
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("round", s.round), v("restart_count", s.restart_count);
  }
};

// Why a job ended in failure (JOB_FAILED's `cause`): the agents word their summary by it.
enum class FailCause : int64_t {
  Other = 0,
  BudgetSpent = 1,    // a failure with max_restarts restarts already spent
  Deterministic = 2,  // two attempts in a row failed the same way, quickly, before the store filled
  LostNodes = 3,      // fewer than min_nodes remain
  Timeout = 4,        // the rendezvous timed out
  ConfigError = 5,    // a worker said no restart can fix it (Failure::config_error)
};

struct JobFailed {
  static constexpr MsgType kType = MsgType::JobFailed;
  std::string reason;
  int64_t cause = static_cast<int64_t>(FailCause::Other);
  int64_t restart_count = 0, max_restarts = 0;
  std::optional<Failure> first_failure;  // fields "first_failure.<name>"

  FailCause fail_cause() const { return static_cast<FailCause>(cause); }
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("reason", s.reason), v("cause", s.cause), v("restart_count", s.restart_count);
    v("max_restarts", s.max_restarts), v("first_failure", s.first_failure);
  }
};

// The token handshake (agent_auth.h says why it goes this way).
struct Hello {
  static constexpr MsgType kType = MsgType::Hello;
  // 2: this agent seals every message after a token handshake (session_mac.h); 1: an older one.
  int64_t version = 2;
  std::string client_nonce;  // hex
  std::string munge;         // inside a Slurm step without a token: a munge credential (munge_auth.h)
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("version", s.version), v("client_nonce", s.client_nonce), v("munge", s.munge);
  }
};

struct Auth {
  static constexpr MsgType kType = MsgType::Auth;
  std::string proof;  // hex HMAC-SHA256
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("proof", s.proof);
  }
};

struct Challenge {
  static constexpr MsgType kType = MsgType::Challenge;
  bool token_required = false;
  std::string server_nonce, server_proof;  // hex; empty without a token
  // A standing server (ddprund), not an agent hosting its job: worth reconnecting to.
  bool standing = false;
  // 2: this server seals every message after a token handshake (session_mac.h); 3: and binds
  // `standing` and `version` to the token (`binding`, agent_auth.h); absent (1): an older one.
  int64_t version = 1;
  std::string binding;  // hex; empty without a token or before version 3
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("token_required", s.token_required), v("server_nonce", s.server_nonce), v("server_proof", s.server_proof);
    v("standing", s.standing), v("version", s.version), v("binding", s.binding);
  }
};

struct Welcome {
  static constexpr MsgType kType = MsgType::Welcome;
  template <class S, class V>
  static void visit(S&, V&&) {}
};

struct StatusReply {
  static constexpr MsgType kType = MsgType::StatusReply;
  bool found = false;        // the server knows a job of that run id
  std::string agents;        // a JSON array of the snapshots of its current members, by node rank
  int64_t members = 0;       // agents in the job (some may not have sent a snapshot yet)
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("found", s.found), v("agents", s.agents), v("members", s.members);
  }
};

struct Error {
  static constexpr MsgType kType = MsgType::Error;
  std::string message;
  template <class S, class V>
  static void visit(S& s, V&& v) {
    v("message", s.message);
  }
};

// The one encoder and decoder of the structs above.
template <class T>
Message to_message(const T& t);
// Reads `m` as a T (m.type must be T::kType; fields absent or malformed keep their defaults).
template <class T>
T from_message(const Message& m);

// Appends one frame to `out`.
void encode_message(const Message& m, std::string& out);
template <class T>
void encode(const T& t, std::string& out) {
  encode_message(to_message(t), out);
}

// Parses one frame from the start of `buf` (Ok / NeedMore with need_total / Bad with error).
wire::ParseResult parse_message(std::span<const uint8_t> buf, Message& out);

}  // namespace ddprun::rdzv
