#include "ddprun/rdzv/crypto.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <memory>
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
  if (EVP_Digest(data.data(), data.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != d.size()) fail("SHA-256");
  return d;
}

// Fetched once: fetching on every MAC (as HMAC() does) costs more than the MAC itself.
EVP_MAC* hmac_algorithm() {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) fail("fetching HMAC");
  return mac;
}

HmacSha256::HmacSha256(std::string_view key) {
  static const unsigned char kNoKey = 0;  // an empty key still needs an address
  const auto* k = key.empty() ? &kNoKey : reinterpret_cast<const unsigned char*>(key.data());
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac_algorithm());
  if (ctx == nullptr || EVP_MAC_init(ctx, k, key.size(), params) != 1) {
    EVP_MAC_CTX_free(ctx);
    fail("keying HMAC-SHA256");
  }
  keyed_.reset(ctx, EVP_MAC_CTX_free);
}

Digest HmacSha256::operator()(std::string_view message) const {
  const std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_dup(keyed_.get()), EVP_MAC_CTX_free);
  Digest d{};
  size_t n = 0;
  if (ctx == nullptr ||
      EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      EVP_MAC_final(ctx.get(), d.data(), &n, d.size()) != 1 || n != d.size())
    fail("HMAC-SHA256");
  return d;
}

Digest hmac_sha256(std::string_view key, std::string_view message) { return HmacSha256(key)(message); }

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
