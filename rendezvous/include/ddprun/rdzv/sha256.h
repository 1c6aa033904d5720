// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and dependency-free: the agents'
// token handshake (agent_auth.h) needs nothing more. Tested against the FIPS and RFC 4231
// vectors and against Python's hashlib/hmac (tests/rendezvous/auth_test.cpp).
//
// Pure; thread-safe (no shared state).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun::rdzv {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  Sha256& update(std::string_view data);
  Digest finish();  // the object is spent afterwards
  // The x86 SHA extensions are used where the CPU has them. Tests turn them off (false) to
  // compare both; returns whether the CPU has them.
  static bool use_accelerated(bool on);

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);

std::string to_hex(const Digest& d);

// Equal strings, in time that depends on their lengths only (never on where they differ).
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace ddprun::rdzv
