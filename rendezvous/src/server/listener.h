// One listening address of the server (the main port, or a round's workers' store): one
// listening socket per I/O thread, each used only on its thread, which accepts straight into
// its own io_context, so accepts run in parallel and no connection is handed between threads.
// With several threads the sockets form a SO_REUSEPORT group (see bind()).
//
// Running out of descriptors (EMFILE/ENFILE) pauses accepting on that socket briefly (the
// connection waits in the backlog); the server keeps serving.
//
// Thread-safety: bind() and listen() before start(); start() and stop() from any thread (they
// post to the sockets' threads). The accept callback runs on the socket's thread.
#pragma once

#include <atomic>
#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server_log.h"

namespace ddprun::server {

class Listener {
 public:
  using tcp = boost::asio::ip::tcp;
  // A new connection on the socket of thread `thread_index`, from `peer` as accept returned it
  // (the socket's remote_endpoint() fails once the peer reset).
  using OnSocket = std::function<void(tcp::socket socket, const tcp::endpoint& peer, size_t thread_index)>;

  // `ios`: one io_context per I/O thread (the first also resolves names); `name` for messages.
  Listener(std::vector<boost::asio::io_context*> ios, std::string name, WarnLimiter& warns,
           std::atomic<uint64_t>& accept_errors);
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Binds `host`:`port` ("" = dual-stack any address, else IPv4 any; port 0 = a free one) and,
  // when `listen_now`, listens. Throws boost::system::system_error (host "") or
  // std::system_error naming the address.
  void bind(const std::string& host, uint16_t port, int backlog, bool listen_now);
  // Listens on sockets bound with listen_now = false (nothing is pending on them yet).
  void listen(int backlog);
  void start(OnSocket on_socket);
  // Closes the sockets, each on its own thread.
  void stop();
  // Stopped, and no handler of it is pending on any thread any more: it may be destroyed.
  bool quiet() const { return stopping_ && busy_.load() == 0; }
  uint16_t port() const { return port_; }
  size_t sockets() const { return acceptors_.size(); }
  const tcp::endpoint& endpoint() const { return endpoint_; }
  const std::string& name() const { return name_; }

 private:
  void do_accept(size_t i);
  void retry_later(size_t i);
  void on_accept(size_t i, boost::system::error_code ec, tcp::socket sock);
  bool bind_one(tcp::endpoint ep, int backlog, bool listen_now);
  // Out of descriptors: accepts one waiting connection with the reserve descriptor and closes
  // it at once (the client sees the refusal instead of a silent backlog). False: none waited.
  bool refuse_one(size_t i);

  std::vector<boost::asio::io_context*> ios_;
  std::string name_;
  WarnLimiter& warns_;
  std::atomic<uint64_t>& accept_errors_;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors_;  // [i] belongs to ios_[i]
  std::vector<tcp::endpoint> peers_;                       // [i]: the peer of acceptors_[i]'s accept
  OnSocket on_socket_;
  tcp::endpoint endpoint_;
  uint16_t port_ = 0;
  // Handlers that will still run on some thread and name this listener: the closes stop()
  // posted, each until what its close aborted has run; backoff timers (retry_later).
  std::atomic<int> busy_{0};
  std::atomic<bool> stopping_{false};
};

// Grows this process's descriptor table once, now, to what RLIMIT_NOFILE allows (a bounded
// number): in a process with several threads every doubling of the table waits for an RCU
// grace period (milliseconds), so a server accepting thousands of connections would otherwise
// stall its accepting threads a dozen times in the middle of a join storm.
void presize_descriptor_table();

}  // namespace ddprun::server
