// Membership without a token inside a Slurm step: munge credentials (docs/SECURITY.md).
//
// Slurm clusters run munged, which vouches for the uid of whoever asks it for a credential and
// keeps a credential's payload secret from everyone but a decoder it names. An agent of an
// srun step, for each connection to the rendezvous:
//
//   makes a fresh random secret K (32 bytes, hex) and a credential that only its own uid may
//   decode, whose payload is "ddprun-rdzv-munge-v1|<job id>|<step id>|<client nonce>|K",
//   and sends it in its HELLO (field `munge`).
//
// The server decodes it (through its own munged), and admits the connection only when munge
// vouches for the server's own uid and the payload names the server's job and step and this
// connection's nonce; K is then the connection's token: CHALLENGE, AUTH and every later
// message go exactly as with a token (agent_auth.h, session_mac.h). So the server proves it
// could decode (it runs as the same user where munge trusts it), the agent proves it made the
// credential, and a credential replayed on another connection is useless (its nonce, and K,
// which nobody else can read). A credential of another user, of another job or of another
// step is refused, with the reason.
//
// check_munge_credential() is pure; MungeClient (the rdzv_io library) loads libmunge at run
// time (libmunge.so.2), so a host without munge runs ddprun all the same (and gets no munge
// authentication).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace ddprun::rdzv {

// The srun step whose agents may join.
struct MungeScope {
  std::string job_id, step_id;
};

inline constexpr const char* kMungeLabel = "ddprun-rdzv-munge-v1";

std::string munge_payload(const MungeScope& scope, const std::string& client_nonce, const std::string& secret);

// What munged said of a credential.
struct MungeDecoded {
  uint32_t uid = 0, gid = 0;
  std::string payload;
};

// A credential that must not admit its sender; the text says why.
class MungeRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The connection secret K of `d`, when munge vouched for `my_uid` and the payload names `scope`
// and `client_nonce`; throws MungeRefused otherwise.
std::string check_munge_credential(const MungeDecoded& d, uint32_t my_uid, const MungeScope& scope,
                                   const std::string& client_nonce);

// libmunge, loaded at run time. Thread-safe (a munge context per call).
class MungeClient {
 public:
  // nullptr when libmunge cannot be loaded or munged does not answer on `socket` ("" = munge's
  // default); `why` says which.
  static std::shared_ptr<MungeClient> open(const std::string& socket, std::string& why);
  ~MungeClient();
  MungeClient(const MungeClient&) = delete;
  MungeClient& operator=(const MungeClient&) = delete;

  // A credential of this process's uid, that only `decoder_uid` may decode.
  std::string encode(const std::string& payload, uint32_t decoder_uid) const;
  // Throws MungeRefused with munge's reason (expired, replayed, invalid, another key, ...).
  MungeDecoded decode(const std::string& credential) const;

  struct Api;

 private:
  MungeClient(void* lib, std::unique_ptr<Api> api, std::string socket);
  void* lib_;
  std::unique_ptr<Api> api_;
  std::string socket_;
};

// The agent's side: for a client nonce, (the credential for HELLO, the connection secret K).
using MungeCredentialMaker = std::function<std::pair<std::string, std::string>(const std::string& client_nonce)>;
MungeCredentialMaker munge_credential_maker(std::shared_ptr<const MungeClient> munge, MungeScope scope);

// The server's side: (credential, client nonce) -> K, or MungeRefused.
using MungeCredentialCheck = std::function<std::string(const std::string& credential, const std::string& client_nonce)>;
MungeCredentialCheck munge_credential_check(std::shared_ptr<const MungeClient> munge, MungeScope scope);

}  // namespace ddprun::rdzv
