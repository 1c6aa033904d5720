// The token handshake and the sealed messages under arbitrary bytes (fuzz_entries.h's
// auth_entry): a server's and an agent's side of one connection, with libcrypto's HMAC under
// both.
//
// Input: byte 0 picks the side and the help given (below); the rest is the peer's byte stream,
// parsed frame by frame as the connection would read it. The fuzzer cannot guess an HMAC, so
// on request the entry puts the right proof into an AUTH (or the right proof and binding into
// a CHALLENGE) and seals a frame with the right session key: that takes it past the handshake
// into the MAC checks, where everything else stays as it sent it.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/session_mac.h"
#include "fuzz_entries.h"

namespace ddprun::fuzz {
namespace {

const std::string kToken = "the fuzzed job's token, 16+ bytes";
const std::string kClientNonce(64, 'a'), kServerNonce(64, 'b');

enum Mode : uint8_t {
  kAgentSide = 1,  // fuzz the agent (the bytes are the server's), else the server
  kProve = 2,      // put the right proof (and binding) into the handshake frame
  kSeal = 4,       // seal frames after the handshake with the right key
  kStanding = 8,   // the server says it is standing
  kOpen = 16,      // the server requires no token
};

// The next frame of `in` from `pos`, or nothing once the stream ends or breaks.
std::optional<rdzv::Message> next_frame(const uint8_t* in, size_t size, size_t& pos) {
  rdzv::Message m;
  const auto r = rdzv::parse_message({in + pos, size - pos}, m);
  if (r.status != wire::ParseStatus::Ok) return std::nullopt;
  pos += r.consumed;
  return m;
}

// A message after the handshake: sealed by the fuzzer or by the right key (kSeal). Only the
// latter may pass, exactly once, in order; what fails changes nothing.
void after_handshake(rdzv::SessionMac& opener, rdzv::SessionMac& honest, rdzv::Message m, bool seal) {
  const uint64_t before = opener.accepted();
  rdzv::Message sent = m;
  if (seal) honest.seal(sent);
  rdzv::Message got = sent;
  const auto v = opener.open(got);
  if (!seal) {
    FUZZ_CHECK(v != rdzv::SessionMac::Verdict::Ok, "a message the fuzzer sealed passed the MAC check");
  } else if (before + 1 == honest.sent()) {
    FUZZ_CHECK(v == rdzv::SessionMac::Verdict::Ok, "a rightly sealed message in sequence was refused");
  }
  if (v == rdzv::SessionMac::Verdict::Ok) {
    FUZZ_CHECK(opener.accepted() == before + 1, "an accepted message moves the sequence by one");
    FUZZ_CHECK(got.type == m.type, "opening keeps the type");
  } else {
    FUZZ_CHECK(opener.accepted() == before, "a refused message changes nothing");
    FUZZ_CHECK(got.fields == sent.fields, "a refused message is left as it came");
  }
}

void server_side(uint8_t mode, const uint8_t* in, size_t size) {
  rdzv::ServerHandshake server((mode & kOpen) ? "" : kToken, kServerNonce, mode & kStanding);
  std::optional<rdzv::SessionMac> opener;
  rdzv::SessionMac honest(kToken, kClientNonce, kServerNonce, rdzv::SessionMac::Side::Agent);
  bool refused = false;
  size_t pos = 0;
  while (auto m = next_frame(in, size, pos)) {
    if (opener) {
      after_handshake(*opener, honest, *m, mode & kSeal);
      continue;
    }
    if ((mode & kProve) && m->type == rdzv::MsgType::Auth)
      m->set("proof", rdzv::agent_proof(kToken, kServerNonce, kClientNonce));
    if ((mode & kProve) && m->type == rdzv::MsgType::Hello) m->set("client_nonce", kClientNonce);
    const auto step = server.on_message(*m);
    FUZZ_CHECK(!(refused && step.admitted), "a refused connection is never admitted");
    refused = refused || step.refused;
    FUZZ_CHECK(!step.refused || (step.reply && step.reply->type == rdzv::MsgType::Error), "a refusal says why");
    if (step.session) {
      FUZZ_CHECK(!(mode & kOpen), "an open rendezvous has no session key");
      FUZZ_CHECK(step.admitted, "a session key comes with the admission");
      opener = step.session;
    }
  }
}

void agent_side(uint8_t mode, const uint8_t* in, size_t size) {
  rdzv::ClientHandshake agent(kToken, kClientNonce, "fuzz:1");
  std::optional<rdzv::SessionMac> opener;
  std::string server_nonce;
  size_t pos = 0;
  while (auto m = next_frame(in, size, pos)) {
    if (opener) {
      rdzv::SessionMac honest(kToken, kClientNonce, server_nonce, rdzv::SessionMac::Side::Server);
      for (uint64_t i = 0; i < opener->accepted(); ++i) {
        rdzv::Message skip;
        honest.seal(skip);
      }
      after_handshake(*opener, honest, *m, mode & kSeal);
      continue;
    }
    if (m->type == rdzv::MsgType::Challenge) {
      server_nonce = m->get("server_nonce");
      if (mode & kProve) {
        const bool standing = m->get("standing") == "1";
        const int64_t version = m->get_int("version");
        m->set("server_proof", rdzv::server_proof(kToken, kClientNonce, server_nonce));
        m->set("binding", rdzv::challenge_binding(kToken, kClientNonce, server_nonce, standing, version));
      }
    }
    try {
      agent.on_reply(*m);
    } catch (const rdzv::HandshakeRefused&) {
      return;  // the agent gives up on this server: the contract
    }
    if (agent.done()) {
      opener = agent.session();
      FUZZ_CHECK(opener.has_value(), "an agent with a token finishes only with a session key");
      FUZZ_CHECK(m->type == rdzv::MsgType::Welcome, "the handshake ends with WELCOME");
    }
  }
}

}  // namespace

void auth_entry(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t mode = data[0];
  if (mode & kAgentSide) agent_side(mode, data + 1, size - 1);
  else server_side(mode, data + 1, size - 1);
}

}  // namespace ddprun::fuzz
