// The scale simulator's network layer: one epoll loop per thread over many non-blocking
// client sockets, each owned by an Endpoint (a simulated agent or worker). Nothing here knows
// a protocol; the endpoints parse what arrives and queue what they send.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::scale {

using Clock = std::chrono::steady_clock;

class Loop;

// One client connection. The loop fills `in`, drains `out`, and calls back.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual void on_connected(Loop& loop) = 0;
  // New bytes are at the end of `in`; consume what is whole.
  virtual void on_readable(Loop& loop) = 0;
  // The connection failed or closed (errno value; 0: EOF). The endpoint is closed after.
  virtual void on_failed(Loop& loop, int err) = 0;

  int fd = -1;
  bool connected = false;
  bool want_out = false;
  std::string out;
  size_t out_off = 0;
  std::vector<uint8_t> in;
};

// A source address per simulated node (127.1.x.y), so that the connections of many nodes do
// not share one address's ephemeral ports, and the server sees them as different hosts.
uint32_t node_address(int64_t node);  // host byte order
std::string address_text(uint32_t addr);

class Loop {
 public:
  Loop();
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Starts a non-blocking connect from `source` (0: the kernel's choice). False (errno set)
  // when it failed at once.
  bool connect(Endpoint& e, const sockaddr_in& to, uint32_t source);
  // Queues bytes and writes what the socket takes now.
  void send(Endpoint& e, const std::string& bytes);
  void close(Endpoint& e);
  // Waits up to `timeout_ms` for events and dispatches them; returns the events handled.
  int poll(int timeout_ms);
  // Another thread may wake a poll() early.
  void wake();
  size_t open_connections() const { return open_; }

 private:
  void flush(Endpoint& e);
  void want(Endpoint& e, bool out);
  void fail(Endpoint& e, int err);

  int ep_ = -1, wake_fd_ = -1;
  size_t open_ = 0;
  std::vector<Endpoint*> by_fd_;
};

}  // namespace ddprun::scale
