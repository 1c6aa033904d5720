// Authenticated messages after the token handshake (agent_auth.h).
//
// Once both sides proved the token, every agent-protocol message either side sends carries
//
//   seq  the sender's sequence number in its direction: 1, 2, 3, ...
//   mac  hex HMAC-SHA256(K, label | frame), where `frame` is the message encoded with `seq`
//        and without `mac` (encode_message: type and fields in key order), and `label` names
//        the direction ("agent->server" or "server->agent")
//
// under a session key K = HMAC-SHA256(token, "ddprun-rdzv-v2 session" | Nc | Ns) that both
// nonces of this connection make fresh. So a relay between an agent and the real server can
// neither inject a message (no key), nor replay one (seq must be exactly one more than the last
// accepted one), nor withhold one and pass the next (the same rule), nor reflect one back to its
// sender (the label), nor carry one to another connection (K). A message that fails is dropped
// and changes nothing; once one was withheld, nothing after it passes either, so what a relay
// can still do is cut the stream, which looks like a lost connection.
//
// Without a token there is no key, and nothing is sealed: the rendezvous is open.
//
// Pure; one object per connection end, used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/rdzv/crypto.h"

namespace ddprun::rdzv {

class SessionMac {
 public:
  enum class Side { Agent, Server };
  SessionMac(std::string_view token, std::string_view client_nonce, std::string_view server_nonce, Side side);

  // Adds `seq` (the next one of this side) and `mac` to `m`.
  void seal(Message& m);

  enum class Verdict { Ok, Unsealed, BadMac, Replayed, OutOfSequence };
  // A message from the peer: Ok (then `seq` and `mac` are removed from it, and its sequence
  // number is the last accepted one), or why it must be dropped (and nothing changed).
  Verdict open(Message& m);
  static const char* describe(Verdict v);

  uint64_t sent() const { return send_seq_; }
  uint64_t accepted() const { return recv_seq_; }

 private:
  std::string mac_of(const Message& m, bool outgoing) const;
  HmacSha256 key_;  // K
  Side side_;
  uint64_t send_seq_ = 0, recv_seq_ = 0;
};

}  // namespace ddprun::rdzv
