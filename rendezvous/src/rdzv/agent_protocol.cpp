#include "ddprun/rdzv/agent_protocol.h"

#include <cstdlib>

namespace ddprun::rdzv {

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::Join: return "JOIN";
    case MsgType::Heartbeat: return "HEARTBEAT";
    case MsgType::Failure: return "FAILURE";
    case MsgType::Succeeded: return "SUCCEEDED";
    case MsgType::Leave: return "LEAVE";
    case MsgType::Hello: return "HELLO";
    case MsgType::Auth: return "AUTH";
    case MsgType::Progress: return "PROGRESS";
    case MsgType::StatusQuery: return "STATUS_QUERY";
    case MsgType::StatusReply: return "STATUS_REPLY";
    case MsgType::Challenge: return "CHALLENGE";
    case MsgType::Welcome: return "WELCOME";
    case MsgType::Round: return "ROUND";
    case MsgType::Restart: return "RESTART";
    case MsgType::JobDone: return "JOB_DONE";
    case MsgType::JobFailed: return "JOB_FAILED";
    case MsgType::Error: return "ERROR";
  }
  return "?";
}

const std::string& Message::get(const std::string& k) const {
  static const std::string empty;
  auto it = fields.find(k);
  return it == fields.end() ? empty : it->second;
}

int64_t Message::get_int(const std::string& k, int64_t fallback) const {
  const std::string& v = get(k);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  return (end && *end == '\0') ? x : fallback;
}

namespace {

struct Encoder {
  Message& m;
  std::string prefix;
  void operator()(const char* k, const std::string& v) const { m.set(prefix + k, v); }
  void operator()(const char* k, int64_t v) const { m.set(prefix + k, v); }
  // Only a true flag travels (old peers test for "1").
  void operator()(const char* k, bool v) const {
    if (v) m.set(prefix + k, "1");
  }
  void operator()(const char* k, const std::optional<Failure>& v) const {
    if (v) Failure::visit(*v, Encoder{m, prefix + k + "."});
  }
};

struct Decoder {
  const Message& m;
  std::string prefix;
  void operator()(const char* k, std::string& v) const {
    if (auto it = m.fields.find(prefix + k); it != m.fields.end()) v = it->second;
  }
  void operator()(const char* k, int64_t& v) const { v = m.get_int(prefix + k, v); }
  void operator()(const char* k, bool& v) const {
    if (auto it = m.fields.find(prefix + k); it != m.fields.end()) v = it->second == "1" || it->second == "true";
  }
  void operator()(const char* k, std::optional<Failure>& v) const {
    const std::string p = prefix + k + ".";
    auto it = m.fields.lower_bound(p);
    if (it == m.fields.end() || it->first.compare(0, p.size(), p) != 0) return;
    v.emplace();
    Failure::visit(*v, Decoder{m, p});
  }
};

}  // namespace

template <class T>
Message to_message(const T& t) {
  Message m;
  m.type = T::kType;
  T::visit(t, Encoder{m, ""});
  return m;
}

template <class T>
T from_message(const Message& m) {
  T t;
  T::visit(t, Decoder{m, ""});
  return t;
}

#define DDPRUN_RDZV_MESSAGE(T)                   \
  template Message to_message<T>(const T&);      \
  template T from_message<T>(const Message&);
DDPRUN_RDZV_MESSAGE(Join)
DDPRUN_RDZV_MESSAGE(Heartbeat)
DDPRUN_RDZV_MESSAGE(Failure)
DDPRUN_RDZV_MESSAGE(Succeeded)
DDPRUN_RDZV_MESSAGE(Leave)
DDPRUN_RDZV_MESSAGE(Progress)
DDPRUN_RDZV_MESSAGE(Round)
DDPRUN_RDZV_MESSAGE(Restart)
DDPRUN_RDZV_MESSAGE(JobDone)
DDPRUN_RDZV_MESSAGE(JobFailed)
DDPRUN_RDZV_MESSAGE(Error)
DDPRUN_RDZV_MESSAGE(Hello)
DDPRUN_RDZV_MESSAGE(Auth)
DDPRUN_RDZV_MESSAGE(Challenge)
DDPRUN_RDZV_MESSAGE(Welcome)
DDPRUN_RDZV_MESSAGE(StatusQuery)
DDPRUN_RDZV_MESSAGE(StatusReply)
#undef DDPRUN_RDZV_MESSAGE

void encode_message(const Message& m, std::string& out) {
  // Sized first, written once: every ROUND of a large job and every MAC encodes a message.
  size_t len = 1 + 8;
  for (const auto& [k, v] : m.fields) len += 8 + k.size() + 8 + v.size();
  out.reserve(out.size() + 4 + len);
  wire::Writer w(out);
  w.u32(static_cast<uint32_t>(len)).u8(static_cast<uint8_t>(m.type)).u64(m.fields.size());
  for (const auto& [k, v] : m.fields) w.blob(k).blob(v);
}

wire::ParseResult parse_message(std::span<const uint8_t> buf, Message& out) {
  wire::ParseResult r;
  if (buf.size() < 4) {
    r.need_total = 4;
    return r;
  }
  const uint32_t len = wire::load_u32(buf.data());
  if (len > kMaxFrameBytes || len < 9) {
    r.status = wire::ParseStatus::Bad;
    r.error = "agent frame length " + std::to_string(len) + " out of range";
    return r;
  }
  if (buf.size() < 4 + size_t(len)) {
    r.need_total = 4 + size_t(len);
    return r;
  }
  const uint8_t* p = buf.data() + 4;
  const uint8_t* end = p + len;
  auto bad = [&](std::string why) {
    r.status = wire::ParseStatus::Bad;
    r.error = std::move(why);
    return r;
  };
  const uint8_t type = *p++;
  const bool known = (type >= 1 && type <= 9) || (type >= 20 && type <= 27);
  if (!known) return bad("unknown agent message type " + std::to_string(type));
  uint64_t n = wire::load_u64(p);
  p += 8;
  if (n > kMaxFields) return bad("too many fields in an agent message");
  out.type = static_cast<MsgType>(type);
  out.fields.clear();
  auto read_blob = [&](std::string& s) -> bool {
    if (end - p < 8) return false;
    uint64_t l = wire::load_u64(p);
    p += 8;
    if (l > uint64_t(end - p)) return false;
    s.assign(reinterpret_cast<const char*>(p), l);
    p += l;
    return true;
  };
  for (uint64_t i = 0; i < n; ++i) {
    std::string k, v;
    if (!read_blob(k) || !read_blob(v)) return bad("truncated field in an agent message");
    out.fields[std::move(k)] = std::move(v);
  }
  if (p != end) return bad("trailing bytes in an agent message");
  r.status = wire::ParseStatus::Ok;
  r.consumed = 4 + size_t(len);
  return r;
}

}  // namespace ddprun::rdzv
