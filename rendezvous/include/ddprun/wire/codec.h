// The TCPStore wire codec: pure bytes in, messages out. No sockets, no threads, and it never
// throws on network bytes: bad input is reported as ParseStatus::Bad with a reason.
// Byte-level format: docs/PROTOCOL.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::wire {

// D0 = PyTorch 1.13/2.0, D1 = 2.1, D2 = 2.2 .. 2.11+ (VALIDATE first, PING from 2.5/2.6).
enum class Dialect : uint8_t { Unknown = 0, D0 = 1, D1 = 2, D2 = 3 };
const char* dialect_name(Dialect d);

enum class Op : uint8_t {
  Validate, Set, CompareSet, Get, Add, Check, Wait, GetNumKeys, DeleteKey, Append, MultiGet,
  MultiSet, CancelWait, Ping, QueuePush, QueuePop, QueueLen, ListKeys, Barrier, WatchKey,
};
const char* op_name(Op op);

// The magic of the D2 VALIDATE message (little-endian on the wire: CE F7 85 3C).
inline constexpr uint32_t kValidateMagic = 0x3C85F7CEu;

// Reply status bytes.
inline constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
inline constexpr uint8_t kWaitStop = 0, kWaitCanceled = 1;
inline constexpr uint8_t kWatchKeyUpdated = 0, kWatchKeyCreated = 1, kWatchKeyDeleted = 2,
                         kWatchCallbackRegistered = 3;

// Hard limits on every length; a request over any of them is Bad (its connection closed).
// Defaults follow PyTorch's libuv server (its default backend since 2.4).
struct Limits {
  uint64_t max_key_len = 8 * 1024;
  uint64_t max_value_len = 8 * 1024 * 1024;
  uint64_t max_keys = 128 * 1024;
  uint64_t max_request_bytes = 64 * 1024 * 1024;
};

// Code <-> operation for a dialect. Legacy codes 7/8 follow `d` (D0: WATCH_KEY/DELETE_KEY,
// D1: DELETE_KEY/APPEND).
std::optional<Op> op_from_code(Dialect d, uint8_t code);
std::optional<uint8_t> code_for_op(Dialect d, Op op);

struct Request {
  Op op = Op::Validate;
  std::vector<std::string> keys;    // every key-carrying op; MULTI_SET keys here
  std::vector<std::string> values;  // SET/APPEND/QUEUE_PUSH value; COMPARE_SET expected,desired; MULTI_SET values
  int64_t number = 0;               // ADD delta; BARRIER world size
  uint32_t u32 = 0;                 // VALIDATE magic; PING nonce
};

// Partial: StepParser::step parsed a part of the request; call it again.
enum class ParseStatus { Ok, NeedMore, Bad, Partial };

struct ParseResult {
  ParseStatus status = ParseStatus::NeedMore;
  size_t consumed = 0;     // Ok: bytes of the request
  size_t need_total = 0;   // NeedMore: the buffer must hold at least this many bytes
  std::string error;       // Bad: why
};

// Parses one request of dialect `d` (not Unknown) from the start of `buf`. Costs O(bytes
// parsed) per call, so calling it again on every read of a large request that arrives in
// pieces is quadratic: servers frame with RequestFramer first and parse once it is whole.
ParseResult parse_request(std::span<const uint8_t> buf, Dialect d, const Limits& limits, Request& out);

// parse_request in steps, for a request the framer found whole: each step() copies about
// `step_bytes` more of its keys and values, so a server can serve its other clients between
// the steps of a 64 MiB request. A request that names no list of keys (not CHECK, WAIT,
// MULTI_GET or MULTI_SET) is parsed whole by the first step.
class StepParser {
 public:
  // `request`: exactly the framed request, the same bytes at every call (they may move in
  // between), and the same `out`. Ok: `out` holds it (consumed = its length); Partial: call
  // again; Bad: error.
  ParseResult step(std::span<const uint8_t> request, Dialect d, const Limits& limits, Request& out, size_t step_bytes);
  size_t parsed_bytes() const { return pos_; }

 private:
  size_t pos_ = 0;      // bytes of the request parsed so far (0: not begun)
  uint64_t count_ = 0;  // keys it names
  uint64_t next_ = 0;   // the next key to parse
};

// Finds where one request ends by walking its length prefixes only, resuming where the last
// call stopped: feeding it the growing buffer of one request costs O(length fields) in all,
// however many reads deliver it. Checks the same limits as parse_request (a lie is Bad as soon
// as its length prefix arrives); allocates nothing.
//
// Contract: every call between reset()s sees the same request at the start of `buf` (more of
// it each time). Ok: consumed = the request's length (parse_request on exactly those bytes
// succeeds or reports a field limit); NeedMore: need_total; Bad: error.
class RequestFramer {
 public:
  ParseResult scan(std::span<const uint8_t> buf, Dialect d, const Limits& limits);
  void reset() { *this = RequestFramer{}; }

 private:
  enum class Stage : uint8_t { Opcode, Count, Blobs, Tail, Done };
  Stage stage_ = Stage::Opcode;
  Op op_ = Op::Validate;
  size_t pos_ = 0;           // bytes of the request accounted for so far
  uint64_t blobs_left_ = 0;  // length-prefixed fields still to walk
  uint64_t blob_index_ = 0;  // which field comes next (key or value?)
  uint32_t blobs_per_count_ = 1;
  uint32_t tail_ = 0;        // fixed bytes after the fields (ADD delta, VALIDATE magic...)
};

// First bytes of a connection: D2 if they are VALIDATE with the right magic (consumed = 5),
// otherwise the legacy dialect given (consumed = 0, the bytes are the first request).
// NeedMore while fewer than 5 bytes decide it. 00 + wrong magic could be a legacy SET, whose
// next 4 bytes are the low half of its key length: Bad when that length is over the limit.
struct DetectResult {
  ParseStatus status = ParseStatus::NeedMore;
  Dialect dialect = Dialect::Unknown;
  size_t consumed = 0;
};
DetectResult detect_dialect(std::span<const uint8_t> buf, Dialect legacy_dialect, const Limits& limits);

// The agents' rendezvous protocol shares the port: a connection announces it with 00 and this
// magic ("DDPR" little-endian), which no TCPStore client sends first (as a legacy SET its key
// length would be 1.4 GB, past every key limit).
inline constexpr uint32_t kAgentHelloMagic = 0x52504444u;

// What a connection speaks, decided by its first bytes.
// Mux: a store relay's multiplexed connection (wire/mux.h), on every listener.
enum class Protocol : uint8_t { Unknown = 0, TcpStore = 1, Agent = 2, Mux = 3 };
struct SniffResult {
  ParseStatus status = ParseStatus::NeedMore;
  Protocol protocol = Protocol::Unknown;
  Dialect dialect = Dialect::Unknown;  // TcpStore: the dialect (detect_dialect)
  size_t consumed = 0;                 // bytes of the announcement (Agent: 5; D2: VALIDATE's 5)
};
// `agents`: whether this listener serves agents at all; without, their announcement is judged
// as TCPStore bytes (and is Bad). NeedMore while the first bytes do not decide it.
SniffResult sniff_protocol(std::span<const uint8_t> buf, bool agents, Dialect legacy_dialect, const Limits& limits);

// ---- encoding (client requests and server replies) ----
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  Writer& u8(uint8_t v) { out_.push_back(static_cast<char>(v)); return *this; }
  Writer& u32(uint32_t v);
  Writer& u64(uint64_t v);
  Writer& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Writer& blob(std::string_view b) { u64(b.size()); out_.append(b); return *this; }
 private:
  std::string& out_;
};

// Encodes `req` in dialect `d`; returns false if `d` has no code for req.op.
bool encode_request(Dialect d, const Request& req, std::string& out);

// Reads little-endian integers (no bounds check: callers check the length).
uint32_t load_u32(const uint8_t* p);
uint64_t load_u64(const uint8_t* p);

}  // namespace ddprun::wire
