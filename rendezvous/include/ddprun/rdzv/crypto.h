// The primitives of the token handshake (agent_auth.h) and the sealed messages (session_mac.h):
// SHA-256, HMAC-SHA256 and a constant-time compare, all computed by OpenSSL's libcrypto. The
// nonces come from libcrypto's RAND_bytes too, in the I/O layer (auth_io.h).
//
// Pure; thread-safe (no shared state). A failure inside libcrypto (none is expected) throws
// std::runtime_error.
#pragma once

#include <openssl/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ddprun::rdzv {

using Digest = std::array<uint8_t, 32>;

Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);

// HMAC-SHA256 under one key, for many messages (a connection's session key): libcrypto's keyed
// context is made once and copied per message. Copies share it; concurrent const use is safe.
class HmacSha256 {
 public:
  explicit HmacSha256(std::string_view key);
  Digest operator()(std::string_view message) const;

 private:
  std::shared_ptr<const EVP_MAC_CTX> keyed_;
};

std::string to_hex(const Digest& d);

// Equal strings, in time that depends on their lengths only (never on where they differ).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace ddprun::rdzv
