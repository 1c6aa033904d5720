#include "ddprun/wire/codec.h"
#include "ddprun/wire/mux.h"

#include <cstring>

namespace ddprun::wire {

const char* dialect_name(Dialect d) {
  switch (d) {
    case Dialect::D0: return "D0 (PyTorch 1.13/2.0)";
    case Dialect::D1: return "D1 (PyTorch 2.1)";
    case Dialect::D2: return "D2 (PyTorch 2.2+)";
    default: return "unknown";
  }
}

const char* op_name(Op op) {
  static constexpr const char* kNames[] = {"VALIDATE",  "SET",       "COMPARE_SET", "GET",        "ADD",
                                           "CHECK",     "WAIT",      "GETNUMKEYS",  "DELETE_KEY", "APPEND",
                                           "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING",       "QUEUE_PUSH",
                                           "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS",   "BARRIER",    "WATCH_KEY"};
  auto i = static_cast<size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "?";
}

namespace {
// D2 codes are the Op order for Validate..Barrier (0..18).
constexpr Op kD2[] = {Op::Validate, Op::Set,      Op::CompareSet, Op::Get,       Op::Add,
                      Op::Check,    Op::Wait,     Op::GetNumKeys, Op::DeleteKey, Op::Append,
                      Op::MultiGet, Op::MultiSet, Op::CancelWait, Op::Ping,      Op::QueuePush,
                      Op::QueuePop, Op::QueueLen, Op::ListKeys,   Op::Barrier};
constexpr Op kD0[] = {Op::Set,  Op::CompareSet, Op::Get,      Op::Add,      Op::Check,
                      Op::Wait, Op::GetNumKeys, Op::WatchKey, Op::DeleteKey};
constexpr Op kD1[] = {Op::Set,        Op::CompareSet, Op::Get,    Op::Add,      Op::Check,    Op::Wait,
                      Op::GetNumKeys, Op::DeleteKey,  Op::Append, Op::MultiGet, Op::MultiSet, Op::CancelWait};

template <size_t N>
std::optional<Op> lookup(const Op (&table)[N], uint8_t code) {
  if (code < N) return table[code];
  return std::nullopt;
}
template <size_t N>
std::optional<uint8_t> reverse(const Op (&table)[N], Op op) {
  for (size_t i = 0; i < N; ++i)
    if (table[i] == op) return static_cast<uint8_t>(i);
  return std::nullopt;
}
}  // namespace

std::optional<Op> op_from_code(Dialect d, uint8_t code) {
  switch (d) {
    case Dialect::D2: return lookup(kD2, code);
    case Dialect::D1: return lookup(kD1, code);
    case Dialect::D0:
      // Codes 9..11 exist only in D1; a legacy client sending them is a 2.1 client.
      if (code >= 9) return lookup(kD1, code);
      return lookup(kD0, code);
    default: return std::nullopt;
  }
}

std::optional<uint8_t> code_for_op(Dialect d, Op op) {
  switch (d) {
    case Dialect::D2: return reverse(kD2, op);
    case Dialect::D1: return reverse(kD1, op);
    case Dialect::D0: return reverse(kD0, op);
    default: return std::nullopt;
  }
}

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t load_u64(const uint8_t* p) { return uint64_t(load_u32(p)) | uint64_t(load_u32(p + 4)) << 32; }

Writer& Writer::u32(uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out_.append(b, 4);
  return *this;
}
Writer& Writer::u64(uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out_.append(b, 8);
  return *this;
}

namespace {

// A cursor over the buffer. Every read checks bounds and limits first; a length prefix is
// checked against its limit before anything is allocated for it.
class Reader {
 public:
  Reader(std::span<const uint8_t> buf, const Limits& limits) : buf_(buf), limits_(limits) {}

  // false => result already filled (NeedMore or Bad)
  bool u32(uint32_t& v) {
    if (!have(4)) return false;
    v = load_u32(buf_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t& v) {
    if (!have(8)) return false;
    v = load_u64(buf_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool blob(std::string& out, uint64_t limit, const char* what) {
    uint64_t n = 0;
    if (!u64(n)) return false;
    if (n > limit)
      return bad(std::string(what) + " length " + std::to_string(n) + " exceeds the limit of " + std::to_string(limit) +
                 " bytes");
    if (!have(n)) return false;
    out.assign(reinterpret_cast<const char*>(buf_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool count(uint64_t& n) {
    if (!u64(n)) return false;
    if (n > limits_.max_keys)
      return bad("key count " + std::to_string(n) + " exceeds the limit of " + std::to_string(limits_.max_keys));
    return true;
  }
  bool key(std::string& k) { return blob(k, limits_.max_key_len, "key"); }
  bool value(std::string& v) { return blob(v, limits_.max_value_len, "value"); }

  bool bad(std::string why) {
    result.status = ParseStatus::Bad;
    result.error = std::move(why);
    return false;
  }
  ParseResult ok() {
    result.status = ParseStatus::Ok;
    result.consumed = pos_;
    return result;
  }
  size_t pos() const { return pos_; }
  void skip(size_t n) { pos_ += n; }

  ParseResult result;

 private:
  bool have(uint64_t n) {
    if (pos_ + n > limits_.max_request_bytes)
      return bad("request larger than the limit of " + std::to_string(limits_.max_request_bytes) + " bytes");
    if (buf_.size() - pos_ >= n) return true;
    result.status = ParseStatus::NeedMore;
    result.need_total = pos_ + n;
    return false;
  }
  std::span<const uint8_t> buf_;
  const Limits& limits_;
  size_t pos_ = 0;
};

}  // namespace

ParseResult parse_request(std::span<const uint8_t> buf, Dialect d, const Limits& limits, Request& out) {
  Reader r(buf, limits);
  if (buf.empty()) {
    r.result.need_total = 1;
    return r.result;
  }
  const uint8_t code = buf[0];
  auto op = op_from_code(d, code);
  if (!op) {
    r.bad("unknown command byte " + std::to_string(code) + " for dialect " + dialect_name(d));
    return r.result;
  }
  r.skip(1);
  out.op = *op;
  out.keys.clear();
  out.values.clear();
  out.number = 0;
  out.u32 = 0;

  auto keys_n = [&](uint64_t n) -> bool {
    out.keys.resize(n);
    for (uint64_t i = 0; i < n; ++i)
      if (!r.key(out.keys[i])) return false;
    return true;
  };
  auto one_key = [&]() -> bool { return keys_n(1); };
  auto one_value = [&]() -> bool {
    out.values.emplace_back();
    return r.value(out.values.back());
  };

  bool ok = true;
  switch (*op) {
    case Op::Validate:
    case Op::Ping: ok = r.u32(out.u32); break;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush: ok = one_key() && one_value(); break;
    case Op::CompareSet: ok = one_key() && one_value() && one_value(); break;
    case Op::Get:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen:
    case Op::WatchKey: ok = one_key(); break;
    case Op::Add: {
      uint64_t v = 0;
      ok = one_key() && r.u64(v);
      out.number = static_cast<int64_t>(v);
      break;
    }
    case Op::Barrier: {
      uint64_t v = 0;
      ok = one_key() && r.u64(v);
      out.number = static_cast<int64_t>(v);
      break;
    }
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet: {
      uint64_t n = 0;
      ok = r.count(n);
      if (ok) {
        // Every key needs at least its 8-byte length: reject before allocating for a lie.
        if (n * 8 > limits.max_request_bytes) {
          r.bad("key count too large for the request limit");
          ok = false;
        } else ok = keys_n(n);
      }
      break;
    }
    case Op::MultiSet: {
      uint64_t n = 0;
      ok = r.count(n);
      if (ok) {
        if (n * 16 > limits.max_request_bytes) {
          r.bad("key count too large for the request limit");
          ok = false;
          break;
        }
        out.keys.resize(n);
        out.values.resize(n);
        for (uint64_t i = 0; ok && i < n; ++i) ok = r.key(out.keys[i]) && r.value(out.values[i]);
      }
      break;
    }
    case Op::GetNumKeys:
    case Op::CancelWait:
    case Op::ListKeys: break;
  }
  if (!ok) return r.result;
  return r.ok();
}

ParseResult StepParser::step(std::span<const uint8_t> request, Dialect d, const Limits& limits, Request& out,
                             size_t step_bytes) {
  if (pos_ == 0) {
    const auto op = request.empty() ? std::nullopt : op_from_code(d, request[0]);
    const bool listed = op && (*op == Op::Check || *op == Op::Wait || *op == Op::MultiGet || *op == Op::MultiSet);
    if (!listed) return parse_request(request, d, limits, out);
    Reader r(request, limits);
    r.skip(1);
    uint64_t n = 0;
    if (!r.count(n)) return r.result;
    // Every key needs at least its 8-byte length (and a MULTI_SET value its own): reject before
    // allocating for a lie.
    if (n * (*op == Op::MultiSet ? 16 : 8) > limits.max_request_bytes) {
      r.bad("key count too large for the request limit");
      return r.result;
    }
    out = Request{.op = *op};
    out.keys.resize(n);
    if (*op == Op::MultiSet) out.values.resize(n);
    count_ = n;
    pos_ = r.pos();
  }
  Reader r(request, limits);
  r.skip(pos_);
  const size_t stop = pos_ + step_bytes;
  const bool values = out.op == Op::MultiSet;
  for (; next_ < count_ && r.pos() < stop; ++next_)
    if (!r.key(out.keys[next_]) || (values && !r.value(out.values[next_]))) return r.result;
  pos_ = r.pos();
  if (next_ < count_) return {ParseStatus::Partial, 0, 0, {}};
  return r.ok();
}

namespace {
ParseResult need(size_t total) {
  ParseResult r;
  r.status = ParseStatus::NeedMore;
  r.need_total = total;
  return r;
}
ParseResult bad_result(std::string why) {
  ParseResult r;
  r.status = ParseStatus::Bad;
  r.error = std::move(why);
  return r;
}
std::string too_large(const Limits& limits) {
  return "request larger than the limit of " + std::to_string(limits.max_request_bytes) + " bytes";
}
}  // namespace

ParseResult RequestFramer::scan(std::span<const uint8_t> buf, Dialect d, const Limits& limits) {
  if (stage_ == Stage::Opcode) {
    if (buf.empty()) return need(1);
    auto op = op_from_code(d, buf[0]);
    if (!op) return bad_result("unknown command byte " + std::to_string(buf[0]) + " for dialect " + dialect_name(d));
    op_ = *op;
    pos_ = 1;
    stage_ = Stage::Blobs;
    switch (op_) {
      case Op::Validate:
      case Op::Ping: tail_ = 4; break;
      case Op::Set:
      case Op::Append:
      case Op::QueuePush: blobs_left_ = 2; break;
      case Op::CompareSet: blobs_left_ = 3; break;
      case Op::Get:
      case Op::DeleteKey:
      case Op::QueuePop:
      case Op::QueueLen:
      case Op::WatchKey: blobs_left_ = 1; break;
      case Op::Add:
      case Op::Barrier:
        blobs_left_ = 1;
        tail_ = 8;
        break;
      case Op::Check:
      case Op::Wait:
      case Op::MultiGet: stage_ = Stage::Count; break;
      case Op::MultiSet:
        stage_ = Stage::Count;
        blobs_per_count_ = 2;
        break;
      case Op::GetNumKeys:
      case Op::CancelWait:
      case Op::ListKeys: break;
    }
  }
  if (stage_ == Stage::Count) {
    if (pos_ + 8 > limits.max_request_bytes) return bad_result(too_large(limits));
    if (buf.size() < pos_ + 8) return need(pos_ + 8);
    const uint64_t n = load_u64(buf.data() + pos_);
    if (n > limits.max_keys)
      return bad_result("key count " + std::to_string(n) + " exceeds the limit of " + std::to_string(limits.max_keys));
    // Every field needs at least its 8-byte length: refuse a count the request limit cannot hold.
    if (n * 8 * blobs_per_count_ > limits.max_request_bytes)
      return bad_result("key count too large for the request limit");
    pos_ += 8;
    blobs_left_ = n * blobs_per_count_;
    stage_ = Stage::Blobs;
  }
  while (stage_ == Stage::Blobs && blobs_left_ > 0) {
    // pos_ may already point past a field whose bytes have not all arrived.
    if (pos_ + 8 > limits.max_request_bytes) return bad_result(too_large(limits));
    if (buf.size() < pos_ + 8) return need(pos_ + 8);
    const uint64_t n = load_u64(buf.data() + pos_);
    bool is_key = true;
    if (op_ == Op::MultiSet) is_key = blob_index_ % 2 == 0;
    else if (op_ == Op::Set || op_ == Op::Append || op_ == Op::QueuePush || op_ == Op::CompareSet)
      is_key = blob_index_ == 0;
    const uint64_t limit = is_key ? limits.max_key_len : limits.max_value_len;
    if (n > limit)
      return bad_result(std::string(is_key ? "key" : "value") + " length " + std::to_string(n) +
                        " exceeds the limit of " + std::to_string(limit) + " bytes");
    if (pos_ + 8 + n > limits.max_request_bytes) return bad_result(too_large(limits));
    pos_ += 8 + n;
    --blobs_left_;
    ++blob_index_;
  }
  if (stage_ == Stage::Blobs) stage_ = Stage::Tail;
  if (stage_ == Stage::Tail) {
    if (pos_ + tail_ > limits.max_request_bytes) return bad_result(too_large(limits));
    pos_ += tail_;
    tail_ = 0;
    stage_ = Stage::Done;
  }
  if (buf.size() < pos_) return need(pos_);
  ParseResult r;
  r.status = ParseStatus::Ok;
  r.consumed = pos_;
  return r;
}

DetectResult detect_dialect(std::span<const uint8_t> buf, Dialect legacy_dialect, const Limits& limits) {
  DetectResult res;
  if (buf.empty()) return res;
  if (buf[0] != 0) {
    res.status = ParseStatus::Ok;
    res.dialect = legacy_dialect;
    return res;
  }
  if (buf.size() < 5) return res;
  res.status = ParseStatus::Ok;
  if (load_u32(buf.data() + 1) == kValidateMagic) {
    res.dialect = Dialect::D2;
    res.consumed = 5;
  } else if (load_u32(buf.data() + 1) > limits.max_key_len) {
    res.status = ParseStatus::Bad;  // neither VALIDATE nor a plausible legacy SET
  } else {
    res.dialect = legacy_dialect;  // a legacy SET (code 0)
  }
  return res;
}

SniffResult sniff_protocol(std::span<const uint8_t> buf, bool agents, Dialect legacy_dialect, const Limits& limits) {
  SniffResult res;
  if (agents && buf.size() >= 5 && buf[0] == 0 && load_u32(buf.data() + 1) == kAgentHelloMagic) {
    res.status = ParseStatus::Ok;
    res.protocol = Protocol::Agent;
    res.consumed = 5;
    return res;
  }
  if (buf.size() >= 5 && buf[0] == 0 && load_u32(buf.data() + 1) == mux::kMuxMagic) {
    res.status = ParseStatus::Ok;
    res.protocol = Protocol::Mux;
    res.consumed = 5;
    return res;
  }
  const DetectResult det = detect_dialect(buf, legacy_dialect, limits);
  res.status = det.status;
  res.dialect = det.dialect;
  res.consumed = det.consumed;
  if (det.status == ParseStatus::Ok) res.protocol = Protocol::TcpStore;
  return res;
}

bool encode_request(Dialect d, const Request& req, std::string& out) {
  auto code = code_for_op(d, req.op);
  if (!code) return false;
  Writer w(out);
  w.u8(*code);
  switch (req.op) {
    case Op::Validate:
    case Op::Ping: w.u32(req.u32); break;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush: w.blob(req.keys.at(0)).blob(req.values.at(0)); break;
    case Op::CompareSet: w.blob(req.keys.at(0)).blob(req.values.at(0)).blob(req.values.at(1)); break;
    case Op::Get:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen:
    case Op::WatchKey: w.blob(req.keys.at(0)); break;
    case Op::Add:
    case Op::Barrier: w.blob(req.keys.at(0)).i64(req.number); break;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet:
      w.u64(req.keys.size());
      for (const auto& k : req.keys) w.blob(k);
      break;
    case Op::MultiSet:
      w.i64(static_cast<int64_t>(req.keys.size()));
      for (size_t i = 0; i < req.keys.size(); ++i) w.blob(req.keys[i]).blob(req.values.at(i));
      break;
    case Op::GetNumKeys:
    case Op::CancelWait:
    case Op::ListKeys: break;
  }
  return true;
}

}  // namespace ddprun::wire
