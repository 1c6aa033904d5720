#include "ddprun/rdzv/agent_auth.h"

#include <stdexcept>

#include "ddprun/rdzv/crypto.h"
#include "ddprun/rdzv/validate.h"

namespace ddprun::rdzv {
namespace {
constexpr const char* kServerLabel = "ddprun-rdzv-v1 server";
constexpr const char* kAgentLabel = "ddprun-rdzv-v1 agent";
constexpr const char* kChallengeLabel = "ddprun-rdzv-v3 challenge";

bool is_nonce(const std::string& s) {
  if (s.size() != 2 * kNonceBytes) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

Message error_msg(const std::string& text) { return to_message(Error{.message = text}); }
}  // namespace

std::string server_proof(const std::string& token, const std::string& client_nonce, const std::string& server_nonce) {
  return to_hex(hmac_sha256(token, std::string(kServerLabel) + "|" + client_nonce + "|" + server_nonce));
}

std::string agent_proof(const std::string& token, const std::string& server_nonce, const std::string& client_nonce) {
  return to_hex(hmac_sha256(token, std::string(kAgentLabel) + "|" + server_nonce + "|" + client_nonce));
}

std::string challenge_binding(const std::string& token, const std::string& client_nonce,
                              const std::string& server_nonce, bool standing, int64_t version) {
  return to_hex(hmac_sha256(token, std::string(kChallengeLabel) + "|" + client_nonce + "|" + server_nonce + "|" +
                                       (standing ? "standing=1" : "standing=0") +
                                       "|version=" + std::to_string(version)));
}

ServerHandshake::ServerHandshake(std::string token, std::string server_nonce, bool standing, MungeCredentialCheck munge)
    : token_(std::move(token)), server_nonce_(std::move(server_nonce)), standing_(standing), munge_(std::move(munge)) {}

ServerHandshake::Step ServerHandshake::refuse(std::string text, std::string why) {
  state_ = State::Refused;
  Step s;
  s.reply = error_msg(text);
  s.refused = true;
  s.why = std::move(why);
  return s;
}

ServerHandshake::Step ServerHandshake::on_message(const Message& m) {
  Step s;
  switch (state_) {
    case State::Admitted: s.admitted = s.forward = true; return s;
    case State::Refused: return refuse("rendezvous refused", "a message after a refusal");
    case State::Fresh:
      if (m.type != MsgType::Hello) {
        if (token_.empty() && !munge_) {
          state_ = State::Admitted;  // an open rendezvous takes an agent that skips HELLO
          s.admitted = s.forward = true;
          return s;
        }
        return refuse(std::string("rendezvous refused: ") + msg_type_name(m.type) +
                          " before authentication; this server requires a token: " + kTokenAdvice,
                      std::string(msg_type_name(m.type)) + " without authentication");
      }
      {
        const Hello h = from_message<Hello>(m);
        if (!is_nonce(h.client_nonce)) return refuse("rendezvous refused: HELLO without a valid nonce", "bad HELLO");
        if ((!token_.empty() || munge_) && h.version < 2)
          return refuse("rendezvous refused: this agent is an older ddprun that does not authenticate its messages "
                        "after the handshake; run the same ddprun version on every node and on the server",
                        "HELLO of version " + std::to_string(h.version));
        client_nonce_ = h.client_nonce;
        if (token_.empty() && munge_) {
          if (h.munge.empty())
            return refuse(
                "rendezvous refused: this rendezvous admits only the agents of its Slurm step, by their munge "
                "credentials, and this agent sent none; start every agent in the same srun step (or give "
                "every node and the server the same --rdzv_token_file)",
                "HELLO without a munge credential");
          try {
            token_ = munge_(h.munge, client_nonce_);
          } catch (const std::exception& e) {
            return refuse(std::string("rendezvous refused: ") + e.what(), std::string("munge: ") + e.what());
          }
        }
      }
      if (token_.empty()) {
        state_ = State::Admitted;
        s.reply = to_message(Challenge{.token_required = false, .standing = standing_});
        s.admitted = true;
        return s;
      }
      state_ = State::Challenged;
      s.reply = to_message(
          Challenge{.token_required = true,
                    .server_nonce = server_nonce_,
                    .server_proof = server_proof(token_, client_nonce_, server_nonce_),
                    .standing = standing_,
                    .version = kChallengeVersion,
                    .binding = challenge_binding(token_, client_nonce_, server_nonce_, standing_, kChallengeVersion)});
      return s;
    case State::Challenged: {
      if (m.type != MsgType::Auth)
        return refuse(std::string("rendezvous refused: ") + msg_type_name(m.type) + " before authentication; " +
                          kTokenAdvice,
                      std::string(msg_type_name(m.type)) + " instead of AUTH");
      const Auth a = from_message<Auth>(m);
      if (!constant_time_equal(a.proof, agent_proof(token_, server_nonce_, client_nonce_)))
        return refuse(std::string(
                          "rendezvous refused: token mismatch (this agent's token differs from the server's); ") +
                          kTokenAdvice,
                      "token mismatch");
      state_ = State::Admitted;
      s.reply = to_message(Welcome{});
      s.admitted = true;
      s.session.emplace(token_, client_nonce_, server_nonce_, SessionMac::Side::Server);
      return s;
    }
  }
  return s;
}

ClientHandshake::ClientHandshake(const AgentCredentials& credentials, std::string client_nonce, std::string where)
    : token_(credentials.token), client_nonce_(std::move(client_nonce)), where_(std::move(where)) {
  if (token_.empty() && credentials.munge) std::tie(munge_credential_, token_) = credentials.munge(client_nonce_);
}

Message ClientHandshake::hello() const {
  return to_message(Hello{.client_nonce = client_nonce_, .munge = munge_credential_});
}

std::optional<Message> ClientHandshake::on_reply(const Message& m) {
  if (m.type == MsgType::Error)
    throw HandshakeRefused(printable(from_message<Error>(m).message, kMaxReasonLen) + " (server " + where_ + ")");
  if (!challenged_) {
    if (m.type != MsgType::Challenge)
      throw HandshakeRefused("the rendezvous server at " + where_ + " answered HELLO with " + msg_type_name(m.type) +
                             " (not a ddprun rendezvous of this version?)");
    challenged_ = true;
    const Challenge c = from_message<Challenge>(m);
    standing_ = c.standing;
    if (!c.token_required) {
      // An agent with munge credentials trusts no open server either: anything that took the
      // rendezvous port first (another user's process) could answer so and steer the job.
      if (!munge_credential_.empty())
        throw HandshakeRefused("rendezvous refused: the server at " + where_ +
                               " asks for no credential, but this agent proves its Slurm step with munge, so it "
                               "cannot tell that server from an impostor: give the server and every agent the same "
                               "token (--rdzv_token_file or DDPRUN_RDZV_TOKEN), or run the agents with --no_slurm "
                               "and explicit flags to join an open rendezvous");
      if (!token_.empty())
        throw HandshakeRefused("rendezvous refused: the server at " + where_ +
                               " requires no token but this agent has one, so it cannot tell it from an impostor; " +
                               kTokenAdvice);
      done_ = true;
      return std::nullopt;
    }
    if (token_.empty())
      throw HandshakeRefused("rendezvous refused: the server at " + where_ +
                             " requires a token and this agent has none; " + kTokenAdvice);
    if (!is_nonce(c.server_nonce) ||
        !constant_time_equal(c.server_proof, server_proof(token_, client_nonce_, c.server_nonce)))
      throw HandshakeRefused("rendezvous refused: token mismatch (the server at " + where_ +
                             " holds a different token); " + kTokenAdvice);
    if (c.version < kChallengeVersion)
      throw HandshakeRefused("rendezvous refused: the server at " + where_ +
                             " is an older ddprun that does not authenticate all of its handshake and messages; run "
                             "the same ddprun version on every node and on the server");
    if (!constant_time_equal(c.binding,
                             challenge_binding(token_, client_nonce_, c.server_nonce, c.standing, c.version)))
      throw HandshakeRefused("rendezvous refused: the CHALLENGE from " + where_ +
                             " was altered on its way (its fields do not match the server's proof): something between "
                             "this node and the server rewrites the rendezvous; connect to the server directly");
    server_nonce_ = c.server_nonce;
    return to_message(Auth{.proof = agent_proof(token_, c.server_nonce, client_nonce_)});
  }
  if (m.type != MsgType::Welcome)
    throw HandshakeRefused("the rendezvous server at " + where_ + " answered AUTH with " + msg_type_name(m.type));
  done_ = true;
  return std::nullopt;
}

std::optional<SessionMac> ClientHandshake::session() const {
  if (!done_ || token_.empty()) return std::nullopt;
  return SessionMac(token_, client_nonce_, server_nonce_, SessionMac::Side::Agent);
}

}  // namespace ddprun::rdzv
