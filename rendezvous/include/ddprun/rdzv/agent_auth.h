// Who may join: a shared secret (the rendezvous token) proven by an HMAC challenge-response,
// in both directions, before an agent may join, report or hear anything of a job.
//
//   agent  -> server  HELLO      client_nonce Nc
//   server -> agent   CHALLENGE  token_required, server_nonce Ns, standing, version (3),
//                                server_proof = HMAC-SHA256(token, "ddprun-rdzv-v1 server" | Nc | Ns),
//                                binding = HMAC-SHA256(token, "ddprun-rdzv-v3 challenge" | Nc | Ns
//                                                      | standing | version)
//   agent  -> server  AUTH       proof = HMAC-SHA256(token, "ddprun-rdzv-v1 agent" | Ns | Nc)
//   server -> agent   WELCOME    (or ERROR and a close: "rendezvous refused: token mismatch ...")
//
// Both nonces are 32 random bytes per connection, so no proof can be replayed on another
// connection; the two labels keep the server's proof from serving as an agent's. The agent
// checks the server's proof before it sends its own or anything else: an agent with a token
// trusts no server without the same token (nor one that requires none), so a fake endpoint
// learns nothing. Proofs are compared in constant time. After WELCOME, every message both ways
// is sealed under a key of this connection (session_mac.h), so a relay between the two cannot
// inject, alter or replay one either. HELLO and CHALLENGE carry version 2 or more to say so;
// with a token, either side refuses a peer of version 1 (it would send unsealed messages). The
// CHALLENGE's other fields are bound to the token by `binding` (version 3): a relay that flips
// `standing` (whether the agent reconnects to this server and offers it a store) or the
// version is refused; an agent refuses a server of version 2, whose CHALLENGE has no binding.
// The proof itself is that of version 2, so agents of version 2 still join a version 3 server.
//
// Without a token on the server, CHALLENGE says so and the connection is admitted at once; an
// old-style agent that sends JOIN first is admitted too (the rendezvous is open). With a token,
// anything but HELLO/AUTH before WELCOME is refused and changes nothing.
//
// Pure: the nonces come from the caller (random_nonce(), auth_io.h), the token too (load_token()).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/rdzv/munge_auth.h"
#include "ddprun/rdzv/session_mac.h"

namespace ddprun::rdzv {

inline constexpr size_t kNonceBytes = 32;
// The token (agent_token.h loads it); shorter ones are refused when loaded.
inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

std::string server_proof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce);
std::string agent_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce);
std::string challenge_binding(const std::string& token, const std::string& client_nonce,
                              const std::string& server_nonce, bool standing, int64_t version);
// The CHALLENGE version of this build (binding present from 3 on).
inline constexpr int64_t kChallengeVersion = 3;

// The advice every refusal ends with.
inline constexpr const char* kTokenAdvice =
    "set DDPRUN_RDZV_TOKEN or --rdzv_token_file the same on every node (and on a standing ddprund)";

// How an agent proves it may join: the token ("" = none), or, inside a Slurm step without a
// token, a fresh munge credential per connection whose secret serves as that connection's
// token (munge_auth.h). Made from a token string, so a token is all most callers pass.
struct AgentCredentials {
  std::string token;
  MungeCredentialMaker munge;
  AgentCredentials() = default;
  AgentCredentials(std::string t) : token(std::move(t)) {}           // NOLINT: implicit on purpose
  AgentCredentials(const char* t) : token(t) {}                      // NOLINT
  AgentCredentials(MungeCredentialMaker m) : munge(std::move(m)) {}  // NOLINT
};

// The server's side for one connection.
class ServerHandshake {
 public:
  // `token`: "" = the rendezvous is open, unless `munge` is given: then it admits only agents
  // whose HELLO carries a munge credential that `munge` accepts (its secret becomes this
  // connection's token). `server_nonce`: random_nonce() of auth_io.h (tests pass their own).
  ServerHandshake(std::string token, std::string server_nonce, bool standing = false, MungeCredentialCheck munge = {});

  struct Step {
    std::optional<Message> reply;  // to send to the agent
    bool admitted = false;         // from now on its messages go to the rounds
    bool refused = false;          // `reply` is an ERROR; close the connection after it
    bool forward = false;          // (open rendezvous, no HELLO) admitted, and `m` itself goes to the rounds
    std::string why;               // refused: for the server's log
    // Admitted with a token: every later message is opened with it, every reply sealed.
    std::optional<SessionMac> session;
  };
  // One message of a connection not admitted yet.
  Step on_message(const Message& m);
  bool admitted() const { return state_ == State::Admitted; }

 private:
  enum class State { Fresh, Challenged, Admitted, Refused };
  Step refuse(std::string text, std::string why);
  std::string token_, server_nonce_, client_nonce_;
  bool standing_ = false;
  MungeCredentialCheck munge_;
  State state_ = State::Fresh;
};

// The handshake went wrong on the agent's side: the message says why and what to do.
class HandshakeRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The agent's side. `where`: host:port, for the messages.
class ClientHandshake {
 public:
  // With munge credentials, the constructor asks munged for this connection's credential
  // (std::runtime_error when munged does not answer).
  ClientHandshake(const AgentCredentials& credentials, std::string client_nonce, std::string where);
  Message hello() const;
  // The server's answer to HELLO or AUTH: the next message to send (AUTH), or nothing. Throws
  // HandshakeRefused on a token mismatch (either way), an ERROR, or an answer out of turn.
  std::optional<Message> on_reply(const Message& m);
  bool done() const { return done_; }
  // Done with a token: every later message is sealed with it, every notice opened.
  std::optional<SessionMac> session() const;
  // The server said it is a standing daemon (known once challenged).
  bool server_standing() const { return standing_; }

 private:
  std::string token_, client_nonce_, where_, server_nonce_, munge_credential_;
  bool challenged_ = false, done_ = false, standing_ = false;
};

}  // namespace ddprun::rdzv
