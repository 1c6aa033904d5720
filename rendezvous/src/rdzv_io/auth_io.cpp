#include "ddprun/rdzv/auth_io.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace ddprun::rdzv {

std::string random_nonce() {
  unsigned char bytes[kNonceBytes];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    char why[256] = "no reason given";
    if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, why, sizeof why);
    ERR_clear_error();
    throw std::runtime_error(std::string("libcrypto could not make a random nonce (") + why +
                             "): check that the kernel's random source (getrandom, /dev/urandom) works");
  }
  static const char hex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) s += hex[b >> 4], s += hex[b & 15];
  return s;
}

namespace {
std::string checked_token(std::string t, const std::string& source) {
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ' || t.back() == '\t')) t.pop_back();
  const std::string make = "make one with: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE";
  if (t.size() < kMinTokenBytes)
    throw std::invalid_argument("the rendezvous token from " + source + " is " + std::to_string(t.size()) +
                                " bytes, fewer than " + std::to_string(kMinTokenBytes) + "; " + make);
  if (t.size() > kMaxTokenBytes)
    throw std::invalid_argument("the rendezvous token from " + source + " is longer than " +
                                std::to_string(kMaxTokenBytes) + " bytes; " + make);
  return t;
}
}  // namespace

std::string load_token(const std::string& file, const char* env_value) {
  if (file.empty()) {
    if (env_value == nullptr || *env_value == '\0') return "";
    return checked_token(env_value, "DDPRUN_RDZV_TOKEN");
  }
  const std::string flag = "--rdzv_token_file " + file;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) throw std::invalid_argument(flag + ": cannot open it (" + std::strerror(errno) + ")");
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0) why = std::string("cannot stat it (") + std::strerror(errno) + ")";
  else if (!S_ISREG(st.st_mode)) why = "not a regular file; put the token in a file of its own";
  else if (st.st_uid != ::geteuid())
    why = "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(::geteuid()) +
          "); use a token file of your own";
  else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    why = std::string("mode ") + mode + " lets other users read or change it; run: chmod 600 " + file;
  } else if (st.st_size > static_cast<off_t>(kMaxTokenBytes) + 64)
    why = "larger than a token (" + std::to_string(st.st_size) + " bytes)";
  std::string content;
  if (why.empty()) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 && content.size() <= kMaxTokenBytes + 64)
      content.append(buf, static_cast<size_t>(n));
    if (n < 0) why = std::string("cannot read it (") + std::strerror(errno) + ")";
  }
  ::close(fd);
  if (!why.empty()) throw std::invalid_argument(flag + ": " + why);
  return checked_token(std::move(content), flag);
}

}  // namespace ddprun::rdzv
