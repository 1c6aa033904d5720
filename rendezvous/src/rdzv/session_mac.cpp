#include "ddprun/rdzv/session_mac.h"

#include "ddprun/rdzv/crypto.h"

namespace ddprun::rdzv {
namespace {
constexpr const char* kSessionLabel = "ddprun-rdzv-v2 session";
constexpr const char* kToServer = "agent->server|";
constexpr const char* kToAgent = "server->agent|";
constexpr const char* kSeq = "seq";
constexpr const char* kMac = "mac";

// Strict decimal, no sign, no leading zero, at most 19 digits: 0 = not a sequence number.
uint64_t parse_seq(const std::string& s) {
  if (s.empty() || s.size() > 19 || s[0] == '0') return 0;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}
}  // namespace

namespace {
HmacSha256 session_key(std::string_view token, std::string_view client_nonce, std::string_view server_nonce) {
  const Digest k = hmac_sha256(token, std::string(kSessionLabel) + "|" + std::string(client_nonce) + "|" +
                                          std::string(server_nonce));
  return HmacSha256(std::string_view(reinterpret_cast<const char*>(k.data()), k.size()));
}
}  // namespace

SessionMac::SessionMac(std::string_view token, std::string_view client_nonce, std::string_view server_nonce, Side side)
    : key_(session_key(token, client_nonce, server_nonce)), side_(side) {}

std::string SessionMac::mac_of(const Message& m, bool outgoing) const {
  const bool to_server = (side_ == Side::Agent) == outgoing;
  std::string data = to_server ? kToServer : kToAgent;
  encode_message(m, data);
  return to_hex(key_(data));
}

void SessionMac::seal(Message& m) {
  m.fields.erase(kMac);
  m.set(kSeq, std::to_string(++send_seq_));
  std::string mac = mac_of(m, true);
  m.set(kMac, std::move(mac));
}

SessionMac::Verdict SessionMac::open(Message& m) {
  auto mac_it = m.fields.find(kMac);
  auto seq_it = m.fields.find(kSeq);
  if (mac_it == m.fields.end() || seq_it == m.fields.end()) return Verdict::Unsealed;
  const uint64_t seq = parse_seq(seq_it->second);
  std::string mac = std::move(mac_it->second);
  m.fields.erase(mac_it);
  // The MAC first: a forged message must not learn, or move, anything by its sequence number.
  if (!constant_time_equal(mac, mac_of(m, false))) {
    m.set(kMac, std::move(mac));
    return Verdict::BadMac;
  }
  // Exactly the next one: a relay may not withhold a message and pass the ones after it.
  if (seq != recv_seq_ + 1) {
    m.set(kMac, std::move(mac));
    return seq <= recv_seq_ ? Verdict::Replayed : Verdict::OutOfSequence;
  }
  recv_seq_ = seq;
  m.fields.erase(kSeq);
  return Verdict::Ok;
}

const char* SessionMac::describe(Verdict v) {
  switch (v) {
    case Verdict::Ok: return "authentic";
    case Verdict::Unsealed: return "a message without a MAC after the token handshake";
    case Verdict::BadMac: return "a message whose MAC is wrong (forged, altered, or from another connection)";
    case Verdict::Replayed: return "a replayed message (its sequence number was seen already)";
    case Verdict::OutOfSequence:
      return "a message out of sequence (one before it was withheld): what follows on this connection cannot be "
             "trusted either";
  }
  return "?";
}

}  // namespace ddprun::rdzv
