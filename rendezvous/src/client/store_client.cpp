#include "ddprun/client/store_client.h"
#include "ddprun/client/tcp_connect.h"
#include "ddprun/rdzv/fixed_port_stores.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

namespace ddprun::client {

using wire::Op;
using wire::Writer;
using Clock = std::chrono::steady_clock;

namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

namespace {
wire::Request make(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {}, int64_t num = 0) {
  wire::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = num;
  return r;
}
}  // namespace

#define DDPRUN_SEND(req)                                                                            \
  do {                                                                                              \
    std::string bytes__;                                                                            \
    if (!wire::encode_request(dialect_, (req), bytes__))                                            \
      throw StoreError(std::string(wire::op_name((req).op)) + " is not supported by the store's " + \
                       wire::dialect_name(dialect_) + " protocol");                                 \
    send_all(bytes__);                                                                              \
  } while (0)

StoreClient::StoreClient(StoreClientOptions options) : options_(std::move(options)), dialect_(options_.dialect) {
  if (dialect_ == wire::Dialect::Unknown) dialect_ = wire::Dialect::D2;
  connect_and_handshake();
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::connect_and_handshake() {
  const auto deadline = Clock::now() + options_.connect_timeout;
  std::string error;
  auto backoff = std::chrono::milliseconds(10);
  std::minstd_rand rng(static_cast<unsigned>(::getpid()));
  while (true) {
    fd_ = connect_tcp(options_.host, options_.port, error);
    if (fd_ >= 0) break;
    if (Clock::now() + backoff >= deadline)
      throw StoreError("cannot connect to the store at " + options_.host + ":" + std::to_string(options_.port) +
                       " within " + std::to_string(options_.connect_timeout.count()) + " ms (" + error +
                       "); is the server running and the address right?");
    // Exponential backoff with jitter, so a thousand clients don't retry in lock-step.
    std::this_thread::sleep_for(backoff + std::chrono::milliseconds(rng() % (backoff.count() + 1)));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (dialect_ == wire::Dialect::D2) {
    std::string hello;
    Writer w(hello);
    w.u8(0).u32(wire::kValidateMagic);
    const uint32_t nonce = static_cast<uint32_t>(::getpid());
    if (options_.ping_on_connect) w.u8(*wire::code_for_op(dialect_, Op::Ping)).u32(nonce);
    send_all(hello);  // one write: PyTorch's libuv server needs VALIDATE unsplit
    if (options_.ping_on_connect) {
      uint8_t b[4];
      recv_exact(b, 4);
      if (wire::load_u32(b) != nonce) throw StoreError("store handshake failed: PING echo mismatch");
    }
  }
  if (options_.world_size) {
    DDPRUN_SEND(make(Op::Add, {rdzv::kWorkerJoinKey}, {}, 1));
    recv_i64();
  }
}

std::string StoreClient::wire_key(const std::string& key) const {
  return options_.pytorch_key_prefix ? "/" + key : key;
}

void StoreClient::send_all(const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw StoreError(errno_text("store send failed"));
    }
    off += static_cast<size_t>(n);
  }
}

void StoreClient::recv_exact(void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t r = ::recv(fd_, p, n, 0);
    if (r == 0)
      throw StoreError("the store closed the connection (" + options_.host + ":" + std::to_string(options_.port) + ")");
    if (r < 0) {
      if (errno == EINTR) continue;
      throw StoreError(errno_text("store recv failed"));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

bool StoreClient::wait_readable(Clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0) left = 0;
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw StoreError(errno_text("store poll failed"));
  }
}

uint8_t StoreClient::recv_u8() {
  uint8_t v;
  recv_exact(&v, 1);
  return v;
}
int64_t StoreClient::recv_i64() {
  uint8_t b[8];
  recv_exact(b, 8);
  return static_cast<int64_t>(wire::load_u64(b));
}
std::string StoreClient::recv_blob() {
  uint64_t n = static_cast<uint64_t>(recv_i64());
  if (n > (uint64_t(1) << 32)) throw StoreError("store reply with absurd length " + std::to_string(n));
  std::string s(n, '\0');
  if (n) recv_exact(s.data(), n);
  return s;
}

void StoreClient::set(const std::string& key, const std::string& value) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::Set, {wire_key(key)}, {value}));
}

std::string StoreClient::get(const std::string& key) { return get(key, options_.timeout); }

std::string StoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard lk(mu_);
  auto k = wire_key(key);
  wait_locked({k}, timeout);
  DDPRUN_SEND(make(Op::Get, {k}));
  return recv_blob();
}

std::string StoreClient::get_nowait(const std::string& key) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::Get, {wire_key(key)}));
  return recv_blob();
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::Add, {wire_key(key)}, {}, delta));
  return recv_i64();
}

std::string StoreClient::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::CompareSet, {wire_key(key)}, {expected, desired}));
  return recv_blob();
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  std::lock_guard lk(mu_);
  std::vector<std::string> wk;
  for (const auto& k : keys) wk.push_back(wire_key(k));
  DDPRUN_SEND(make(Op::Check, std::move(wk)));
  return recv_u8() == wire::kCheckReady;
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, options_.timeout); }

void StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard lk(mu_);
  std::vector<std::string> wk;
  for (const auto& k : keys) wk.push_back(wire_key(k));
  wait_locked(wk, timeout);
}

void StoreClient::wait_locked(const std::vector<std::string>& wire_keys, std::chrono::milliseconds timeout) {
  DDPRUN_SEND(make(Op::Wait, wire_keys));
  if (wait_readable(Clock::now() + timeout)) {
    uint8_t s = recv_u8();
    if (s != wire::kWaitStop) throw StoreError("unexpected WAIT reply " + std::to_string(s));
    return;
  }
  std::string keys_text;
  for (const auto& k : wire_keys) keys_text += (keys_text.empty() ? "" : ", ") + k;
  const std::string msg = "wait timeout after " + std::to_string(timeout.count()) + " ms, keys: " + keys_text;
  if (dialect_ == wire::Dialect::D0) {
    // No CANCEL_WAIT in the old protocol: the late reply would corrupt the stream.
    ::shutdown(fd_, SHUT_RDWR);
    throw StoreTimeout(msg + " (connection dropped: the D0 protocol cannot cancel a wait)");
  }
  DDPRUN_SEND(make(Op::CancelWait));
  uint8_t s = recv_u8();
  if (s == wire::kWaitStop) s = recv_u8();  // the key arrived in the race window
  if (s != wire::kWaitCanceled) throw StoreError("unexpected CANCEL_WAIT reply " + std::to_string(s));
  throw StoreTimeout(msg);
}

int64_t StoreClient::num_keys() {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::GetNumKeys));
  return recv_i64();
}

bool StoreClient::delete_key(const std::string& key) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::DeleteKey, {wire_key(key)}));
  return recv_i64() == 1;
}

void StoreClient::append(const std::string& key, const std::string& value) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::Append, {wire_key(key)}, {value}));
}

std::vector<std::string> StoreClient::multi_get(const std::vector<std::string>& keys) {
  std::lock_guard lk(mu_);
  std::vector<std::string> wk;
  for (const auto& k : keys) wk.push_back(wire_key(k));
  wait_locked(wk, options_.timeout);
  DDPRUN_SEND(make(Op::MultiGet, wk));
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out.push_back(recv_blob());
  return out;
}

void StoreClient::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw std::invalid_argument("multi_set: keys and values differ in count");
  std::lock_guard lk(mu_);
  std::vector<std::string> wk;
  for (const auto& k : keys) wk.push_back(wire_key(k));
  DDPRUN_SEND(make(Op::MultiSet, std::move(wk), values));
}

void StoreClient::queue_push(const std::string& key, const std::string& value) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::QueuePush, {wire_key(key)}, {value}));
}

std::string StoreClient::queue_pop(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard lk(mu_);
  auto k = wire_key(key);
  wait_locked({k}, timeout);
  DDPRUN_SEND(make(Op::QueuePop, {k}));
  int64_t len = recv_i64();
  if (len <= 0) throw StoreError("queue '" + key + "' is empty");
  return recv_blob();
}

int64_t StoreClient::queue_len(const std::string& key) {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::QueueLen, {wire_key(key)}));
  return recv_i64();
}

std::vector<std::string> StoreClient::list_keys() {
  std::lock_guard lk(mu_);
  DDPRUN_SEND(make(Op::ListKeys));
  int64_t n = recv_i64();
  if (n < 0 || n > (int64_t(1) << 32)) throw StoreError("LIST_KEYS reply with absurd count");
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) {
    std::string k = recv_blob();
    if (!options_.pytorch_key_prefix) out.push_back(std::move(k));
    else if (!k.empty() && k[0] == '/') out.push_back(k.substr(1));
  }
  return out;
}

std::chrono::nanoseconds StoreClient::ping() {
  std::lock_guard lk(mu_);
  wire::Request r = make(Op::Ping);
  r.u32 = 0xD0D0CAFE;
  auto t0 = Clock::now();
  DDPRUN_SEND(r);
  uint8_t b[4];
  recv_exact(b, 4);
  if (wire::load_u32(b) != r.u32) throw StoreError("PING echo mismatch");
  return Clock::now() - t0;
}

bool connected_to_itself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof local, pl = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return false;
  return ll == pl && std::memcmp(&local, &peer, ll) == 0;
}

int connect_tcp(const std::string& host, uint16_t port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    error = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      if (!connected_to_itself(fd)) break;
      // Nothing listens on a local port of the ephemeral range, and the kernel picked that very
      // port as our source: TCP's simultaneous open "connects" the socket to itself. The store
      // is not up yet; the caller retries as for ECONNREFUSED.
      error = "connect to " + host + ":" + std::to_string(port) + ": nothing listens there yet (self-connect)";
    } else {
      error = "connect to " + host + ":" + std::to_string(port) + ": " + std::strerror(errno);
    }
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace ddprun::client
