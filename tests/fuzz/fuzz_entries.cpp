#include "fuzz_entries.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ddprun/launcher/options.h"
#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/store/store_state.h"
#include "ddprun/wire/codec.h"

namespace ddprun::fuzz {
namespace {

using wire::Dialect;
using wire::ParseResult;
using wire::ParseStatus;

// The contract of every ParseResult the codec hands out for a buffer of `size` bytes.
void check_result(const ParseResult& r, size_t size, const wire::Limits& limits) {
  switch (r.status) {
    case ParseStatus::Ok:
      FUZZ_CHECK(r.consumed > 0 && r.consumed <= size, "Ok consumes part of the buffer");
      FUZZ_CHECK(r.consumed <= limits.max_request_bytes, "Ok request within the request limit");
      break;
    case ParseStatus::NeedMore:
      FUZZ_CHECK(r.need_total > size, "NeedMore asks for more than the buffer holds");
      FUZZ_CHECK(r.need_total <= limits.max_request_bytes, "NeedMore never past the request limit");
      break;
    case ParseStatus::Bad: FUZZ_CHECK(!r.error.empty(), "Bad says why"); break;
    case ParseStatus::Partial: FUZZ_CHECK(false, "Partial comes from StepParser only"); break;
  }
}

// StepParser, in steps of `step` bytes, reads a whole request as parse_request does.
void check_step_parse(std::span<const uint8_t> request, Dialect d, const wire::Limits& limits,
                      const wire::Request& whole, size_t step) {
  wire::StepParser parser;
  wire::Request req;
  ParseResult r;
  do r = parser.step(request, d, limits, req, step);
  while (r.status == ParseStatus::Partial);
  FUZZ_CHECK(r.status == ParseStatus::Ok && r.consumed == request.size(), "the steps parse the request whole");
  FUZZ_CHECK(req.op == whole.op && req.keys == whole.keys && req.values == whole.values && req.number == whole.number &&
                 req.u32 == whole.u32,
             "the steps parse what parse_request parses");
}

void check_request_limits(const wire::Request& req, const wire::Limits& limits) {
  FUZZ_CHECK(req.keys.size() <= limits.max_keys, "key count within max_keys");
  for (const auto& k : req.keys) FUZZ_CHECK(k.size() <= limits.max_key_len, "key within max_key_len");
  for (const auto& v : req.values) FUZZ_CHECK(v.size() <= limits.max_value_len, "value within max_value_len");
}

// encode(parse(encode(r))) == encode(r): what the encoder writes, the parser reads back whole.
void check_request_roundtrip(Dialect d, const wire::Request& req) {
  std::string once;
  if (!wire::encode_request(d, req, once)) return;  // op without a code in this dialect
  const wire::Limits unlimited{1ull << 40, 1ull << 40, 1ull << 40, 1ull << 50};
  wire::Request again;
  auto buf = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(once.data()), once.size());
  auto r = wire::parse_request(buf, d, unlimited, again);
  FUZZ_CHECK(r.status == ParseStatus::Ok, "re-encoded request parses");
  FUZZ_CHECK(r.consumed == once.size(), "re-encoded request parses whole");
  std::string twice;
  FUZZ_CHECK(wire::encode_request(d, again, twice), "re-parsed request encodes");
  FUZZ_CHECK(twice == once, "encode/parse round trip is stable");
}

template <class T>
void check_typed(const rdzv::Message& m) {
  if (m.type != T::kType) return;
  T t = rdzv::from_message<T>(m);
  std::string a, b;
  rdzv::encode(t, a);
  rdzv::Message back;
  auto r = rdzv::parse_message({reinterpret_cast<const uint8_t*>(a.data()), a.size()}, back);
  FUZZ_CHECK(r.status == ParseStatus::Ok && r.consumed == a.size(), "typed message round trip parses");
  rdzv::encode(rdzv::from_message<T>(back), b);
  FUZZ_CHECK(a == b, "typed message round trip is stable");
}

void check_message(const rdzv::Message& m) {
  std::string once;
  rdzv::encode_message(m, once);
  rdzv::Message back;
  auto r = rdzv::parse_message({reinterpret_cast<const uint8_t*>(once.data()), once.size()}, back);
  if (once.size() - 4 <= rdzv::kMaxFrameBytes) {
    FUZZ_CHECK(r.status == ParseStatus::Ok && r.consumed == once.size(), "re-encoded frame parses whole");
    FUZZ_CHECK(back.type == m.type && back.fields == m.fields, "frame round trip keeps type and fields");
  }
  check_typed<rdzv::Join>(m);
  check_typed<rdzv::Failure>(m);
  check_typed<rdzv::Succeeded>(m);
  check_typed<rdzv::Round>(m);
  check_typed<rdzv::Restart>(m);
  check_typed<rdzv::JobDone>(m);
  check_typed<rdzv::JobFailed>(m);
  check_typed<rdzv::Error>(m);
}

// Tight limits half of the time, so the limit paths are reached with small inputs.
wire::Limits limits_from(uint8_t b) {
  wire::Limits l;
  if (b & 0x80) {
    l.max_key_len = 1 + (b & 0x7);
    l.max_value_len = 1 + ((b >> 3) & 0x7) * 4;
    l.max_keys = 1 + ((b >> 6) & 0x1) * 3;
    l.max_request_bytes = 64 + (b & 0x3f) * 8;
  }
  return l;
}

}  // namespace

void codec_entry(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const uint8_t mode = data[0];
  const wire::Limits limits = limits_from(data[1]);
  std::span<const uint8_t> buf(data + 2, size - 2);
  const Dialect legacy = (mode & 1) ? Dialect::D1 : Dialect::D0;

  if (((mode >> 1) & 3) == 2) {  // the agents' frames
    size_t pos = 0;
    while (pos < buf.size()) {
      rdzv::Message m;
      auto r = rdzv::parse_message(buf.subspan(pos), m);
      check_result(r, buf.size() - pos, wire::Limits{~0ull, ~0ull, ~0ull, rdzv::kMaxFrameBytes + 4ull});
      if (r.status != ParseStatus::Ok) break;
      FUZZ_CHECK(m.fields.size() <= rdzv::kMaxFields, "field count within kMaxFields");
      check_message(m);
      pos += r.consumed;
    }
    return;
  }

  // A TCPStore stream: the dialect decided by its first bytes (as the server does) or given.
  Dialect d = legacy;
  size_t pos = 0;
  if (((mode >> 1) & 3) == 0) {
    auto det = wire::detect_dialect(buf, legacy, limits);
    if (det.status != ParseStatus::Ok) {
      if (det.status == ParseStatus::NeedMore) FUZZ_CHECK(buf.size() < 5, "detection decided by 5 bytes");
      return;
    }
    FUZZ_CHECK(det.dialect == Dialect::D2 || det.dialect == legacy, "detected dialect");
    FUZZ_CHECK(det.consumed <= buf.size(), "detection consumes within the buffer");
    d = det.dialect;
    pos = det.consumed;
  } else {
    d = (mode & 0x10) ? Dialect::D2 : legacy;
  }
  while (pos < buf.size()) {
    wire::Request req;
    auto r = wire::parse_request(buf.subspan(pos), d, limits, req);
    check_result(r, buf.size() - pos, limits);
    if (r.status != ParseStatus::Ok) break;
    check_request_limits(req, limits);
    check_step_parse(buf.subspan(pos, r.consumed), d, limits, req, 1 + (mode >> 4));
    check_request_roundtrip(d, req);
    pos += r.consumed;
  }
}

// ---------------------------------------------------------------------------------------
// The server without sockets. Mirrors store_server.cpp: a keyspace per round (or the main
// one, emptied, for fixed_store_port), connections that revoke when their keyspace is
// emptied, agents on the main keyspace only.
namespace {

struct Keyspace {
  store::StoreState state;
};

struct Conn {
  uint64_t id = 0;
  Keyspace* ks = nullptr;
  Dialect dialect = Dialect::Unknown;
  bool agent = false;
  bool revoked = false;
  std::vector<uint8_t> in;
};

class FakeServer : public rdzv::WorkerStores {
 public:
  FakeServer() : rounds_(*this) {}

  uint16_t open(const std::string& run_id, int64_t round, bool fixed_port) override {
    if (fixed_port) {
      revoke(&main_);
      main_.state.clear();
      main_rounds_.insert({run_id, round});
      return kMainPort;
    }
    auto& ks = round_ks_[{run_id, round}];
    ks = std::make_unique<Keyspace>();
    latest_ = ks.get();
    return static_cast<uint16_t>(20000 + round_ks_.size() % 40000);
  }
  void close(const std::string& run_id, int64_t round) override {
    if (main_rounds_.erase({run_id, round})) {
      revoke(&main_);
      main_.state.clear();
      return;
    }
    auto it = round_ks_.find({run_id, round});
    if (it == round_ks_.end()) return;
    revoke(it->second.get());
    it->second->state.clear();
    if (latest_ == it->second.get()) latest_ = nullptr;
    retired_.push_back(std::move(it->second));  // connections may still point at it
    round_ks_.erase(it);
  }
  bool progressed(const std::string& run_id, int64_t round, int64_t world_size) override {
    if (main_rounds_.count({run_id, round})) return main_.state.integer("init/").value_or(0) >= world_size;
    auto it = round_ks_.find({run_id, round});
    return it != round_ks_.end() && it->second->state.integer("init/").value_or(0) >= world_size;
  }

  // Slots 0..5 connect to the main port, 6..7 to the newest round's store when there is one.
  Conn& conn(unsigned slot) {
    auto& c = slots_[slot];
    if (!c) {
      c = std::make_unique<Conn>();
      c->id = next_id_++;
      c->ks = (slot >= 6 && latest_) ? latest_ : &main_;
      ever_.insert(c->id);
    }
    return *c;
  }
  void receive(unsigned slot, std::span<const uint8_t> bytes) {
    Conn& c = conn(slot);
    c.in.insert(c.in.end(), bytes.begin(), bytes.end());
    process(slot);
    reap_revoked();
  }
  void hang_up(unsigned slot) {
    if (slots_[slot]) drop(slot);
    reap_revoked();
  }
  void tick(std::chrono::milliseconds dt) {
    now_ += dt;
    out_.clear();
    rounds_.on_tick(now_, out_);
    route();
    if (auto next = rounds_.next_deadline()) {
      FUZZ_CHECK(*next > now_ - std::chrono::hours(24 * 365), "deadline sane");
    }
    reap_revoked();
  }
  void finish() {
    for (unsigned s = 0; s < kSlots; ++s) hang_up(s);
    FUZZ_CHECK(rounds_.num_agents() == 0, "every agent forgotten once every connection closed");
    FUZZ_CHECK(main_.state.num_waiting_connections() == 0, "no waiter outlives its connection");
  }

  static constexpr unsigned kSlots = 8;

 private:
  static constexpr uint16_t kMainPort = 29400;

  void process(unsigned slot) {
    Conn& c = *slots_[slot];
    size_t pos = 0;
    if (c.dialect == Dialect::Unknown && !c.agent) {
      if (c.in.size() >= 5 && c.in[0] == 0 && wire::load_u32(c.in.data() + 1) == rdzv::kAgentMagic && c.ks == &main_) {
        c.agent = true;
        pos = 5;
      } else {
        auto det = wire::detect_dialect(c.in, Dialect::D1, limits_);
        if (det.status == ParseStatus::NeedMore) return;
        if (det.status == ParseStatus::Bad) return drop(slot);
        c.dialect = det.dialect;
        pos = det.consumed;
      }
    }
    while (pos < c.in.size() && !c.revoked) {
      std::span<const uint8_t> rest(c.in.data() + pos, c.in.size() - pos);
      rdzv::Message msg;
      wire::Request req;
      auto res = c.agent ? rdzv::parse_message(rest, msg) : wire::parse_request(rest, c.dialect, limits_, req);
      if (res.status == ParseStatus::NeedMore) break;
      if (res.status == ParseStatus::Bad) return drop(slot);
      pos += res.consumed;
      if (c.agent) {
        out_.clear();
        rounds_.on_message(c.id, msg, now_, out_);
        route();
        if (!slots_[slot]) return;  // the reply was an ERROR that closes this connection
        continue;
      }
      store::Reply reply;
      std::vector<store::Outgoing> others;
      auto applied = c.ks->state.apply(c.id, c.dialect, req, reply, others);
      FUZZ_CHECK(reply.flatten().size() == reply.wire_size(), "a reply's pieces add up to its wire size");
      if (applied.close) {
        FUZZ_CHECK(!applied.error.empty(), "a refused request says why");
        return drop(slot);
      }
      for (const auto& o : others) FUZZ_CHECK(ever_.count(o.conn), "store output goes to a known connection");
    }
    if (slots_[slot]) c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(pos));
  }

  // What the round state sends: to agents that exist, in frames that parse back.
  void route() {
    std::vector<rdzv::Outbound> out;
    out.swap(out_);
    for (const auto& o : out) {
      FUZZ_CHECK(ever_.count(o.conn), "round output goes to a known connection");
      check_message(o.msg);
      if (o.close_after) {
        for (unsigned s = 0; s < kSlots; ++s) {
          if (slots_[s] && slots_[s]->id == o.conn) drop(s);
        }
      }
    }
  }

  void revoke(Keyspace* ks) {
    for (auto& c : slots_) {
      if (c && c->ks == ks && !c->agent) c->revoked = true;
    }
  }
  void reap_revoked() {
    for (unsigned s = 0; s < kSlots; ++s) {
      if (slots_[s] && slots_[s]->revoked) drop(s);
    }
  }
  void drop(unsigned slot) {
    std::unique_ptr<Conn> c = std::move(slots_[slot]);
    if (c->agent) {
      out_.clear();
      rounds_.on_disconnect(c->id, now_, out_);
      route();
    } else {
      while (c->ks->state.disconnect(c->id)) {  // a large waiter: a slice per call
      }
    }
  }

  wire::Limits limits_;
  rdzv::RoundState rounds_;
  std::vector<rdzv::Outbound> out_;
  Keyspace main_;
  Keyspace* latest_ = nullptr;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Keyspace>> round_ks_;
  std::set<std::pair<std::string, int64_t>> main_rounds_;
  std::vector<std::unique_ptr<Keyspace>> retired_;
  std::unique_ptr<Conn> slots_[kSlots];
  std::set<uint64_t> ever_;
  uint64_t next_id_ = 1;
  rdzv::Clock::time_point now_ = rdzv::Clock::time_point{} + std::chrono::hours(1);
};

}  // namespace

// Commands, one byte each then its operands:
//   0b00ssslll  + u16 len + len bytes : `len` bytes arrive on connection slot s (3 bits, l ignored)
//   0b01sss...                        : connection s closes
//   0b1ttttttt                        : the clock advances by t * 250 ms and the round ticks
void server_entry(const uint8_t* data, size_t size) {
  FakeServer server;
  size_t pos = 0;
  while (pos < size) {
    const uint8_t cmd = data[pos++];
    if (cmd & 0x80) {
      server.tick(std::chrono::milliseconds(250) * (cmd & 0x7f));
    } else if (cmd & 0x40) {
      server.hang_up((cmd >> 3) & 7);
    } else {
      if (size - pos < 2) break;
      size_t len = data[pos] | (size_t{data[pos + 1]} << 8);
      pos += 2;
      len = std::min(len, size - pos);
      server.receive((cmd >> 3) & 7, {data + pos, len});
      pos += len;
    }
  }
  server.finish();
}

void options_entry(const uint8_t* data, size_t size) {
  if (size < 1) return;
  launcher::SystemInfo sys;
  sys.cpu_count = 1 + (data[0] & 0x1f);
  sys.gpu_count = data[0] >> 5;
  std::vector<std::string> argv{"ddprun"};
  launcher::EnvMap env;
  std::string cur;
  auto flush = [&] {
    auto eq = cur.find('=');
    // PET_* and Slurm's variables (slurm.h reads SLURM_* and SLURMD_NODENAME) go to the
    // environment; everything else is an argument.
    if ((cur.rfind("PET_", 0) == 0 || cur.rfind("SLURM", 0) == 0) && eq != std::string::npos) {
      env[cur.substr(0, eq)] = cur.substr(eq + 1);
    } else {
      argv.push_back(cur);
    }
    cur.clear();
  };
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0) flush();
    else cur.push_back(static_cast<char>(data[i]));
  }
  if (!cur.empty()) flush();
  auto out = launcher::parse_command_line(argv, env, sys);
  if (out.options) {
    FUZZ_CHECK(out.exit_code == 0, "a launch has exit code 0");
  } else {
    FUZZ_CHECK(out.exit_code == 0 || out.exit_code == launcher::kUsageExitCode, "exit code 0 (help) or usage");
    FUZZ_CHECK(!out.message.empty(), "no launch without a message");
    if (out.exit_code == launcher::kUsageExitCode)
      for (char c : out.message) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          std::fprintf(stderr, "usage error with a control byte 0x%02x: [%s]\n", c, out.message.c_str());
          FUZZ_CHECK(false, "usage errors are one line without control bytes");
        }
      }
  }
}

Entry entry_by_name(std::string_view name) {
  if (name == "codec") return codec_entry;
  if (name == "server") return server_entry;
  if (name == "options") return options_entry;
  if (name == "auth") return auth_entry;
  return nullptr;
}

}  // namespace ddprun::fuzz
