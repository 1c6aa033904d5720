#include "ddprun/rdzv/crypto.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <stdexcept>

namespace ddprun::rdzv {
namespace {
[[noreturn]] void fail(const char* what) {
  char why[256] = "no reason given";
  if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, why, sizeof why);
  ERR_clear_error();
  throw std::runtime_error(std::string("libcrypto: ") + what + " failed (" + why +
                           "); check the OpenSSL installation (libssl3)");
}
}  // namespace

Digest sha256(std::string_view data) {
  Digest d{};
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != d.size())
    fail("SHA-256");
  return d;
}

Digest hmac_sha256(std::string_view key, std::string_view message) {
  static const unsigned char kNoKey = 0;  // an empty key still needs an address
  Digest d{};
  unsigned int n = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kNoKey) : key.data();
  const auto* m = reinterpret_cast<const unsigned char*>(message.data());
  if (HMAC(EVP_sha256(), k, static_cast<int>(key.size()), m, message.size(), d.data(), &n) == nullptr || n != d.size())
    fail("HMAC-SHA256");
  return d;
}

std::string to_hex(const Digest& d) {
  static const char hex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * d.size());
  for (uint8_t b : d) s += hex[b >> 4], s += hex[b & 15];
  return s;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // The lengths are no secret (a proof or MAC is always 64 hex digits); the contents are.
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ddprun::rdzv
