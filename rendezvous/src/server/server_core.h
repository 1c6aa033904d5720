// The server's parts put together: the I/O threads, the listeners (one per keyspace), the
// connections (ConnectionIo), admission, the keyspaces and the rounds, and the dispatch of
// requests to them (dispatch.cpp). StoreServer is a handle on one ServerCore.
//
// Locking: `mu` guards every keyspace's state, the rounds, `conns`, admission's register, each
// connection's `revoked` flag and the tick timer. A connection's `out_mu` is taken inside `mu`
// or alone (connection.h).
#pragma once

#include <atomic>
#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "admission.h"
#include "connection.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/server/store_server.h"
#include "keyspaces.h"
#include "listener.h"
#include "server_log.h"
#include "state_lock.h"

namespace ddprun::server {

class ServerCore final : public ConnectionEvents, public KeyspaceHost {
 public:
  explicit ServerCore(StoreServerOptions o);
  ~ServerCore() override;

  void start();
  void accept_clients();
  void stop();
  StoreServerStats stats() const;

  // ConnectionEvents (dispatch.cpp, store_server.cpp)
  void on_input(const ConnPtr& c) override;
  void on_closed(const ConnPtr& c) override;
  // KeyspaceHost
  void revoke_locked(const Keyspace* ks) override;
  std::unique_ptr<Listener> make_listener(const std::string& name) override;
  void start_accepting(Keyspace* ks) override;
  size_t num_jobs_locked() const override { return rounds.num_jobs(); }

  StoreServerOptions options;
  WarnLimiter warns;
  std::vector<std::unique_ptr<IoThread>> threads;  // the first also runs the rendezvous tick timer
  StateLock mu;
  ConnectionCounters counters;
  std::atomic<uint64_t> accepted{0}, accept_errors{0};
  ConnectionIo io{options, warns, counters, *this};
  Admission admission{options, warns};
  Keyspaces keyspaces{options, *this};
  rdzv::RoundState rounds{keyspaces};
  std::optional<boost::asio::steady_timer> tick_timer;
  std::unordered_map<store::ConnId, ConnPtr> conns;
  store::ConnId next_id = 1;
  std::atomic<bool> started{false}, stopped{false}, accepting{false};

 private:
  boost::asio::io_context& control() { return threads.front()->io; }
  void check_limits() const;
  void listen_main();
  void on_socket(Keyspace* ks, boost::asio::ip::tcp::socket sock, size_t thread_index);

  // ---- dispatch.cpp ----
  enum class Sniffed { Go, NeedMore, Closed };
  Sniffed sniff(const ConnPtr& c, size_t& pos);
  // Frames and parses the next request of c at `rest` (into t.req or t.msg).
  wire::ParseResult next_request(const ConnPtr& c, std::span<const uint8_t> rest);
  // Under mu. Each returns false when c must stop reading (refused, draining).
  bool on_handshake_message(IoThread& t, const ConnPtr& c, bool& forward);
  bool on_agent_message(IoThread& t, const ConnPtr& c);
  std::string on_store_request(IoThread& t, const ConnPtr& c);
  void route_locked(IoThread& self, std::vector<store::Outgoing>& others);
  void route_locked(IoThread& self, std::vector<rdzv::Outbound>& out);
  void schedule_tick_locked();
  void on_tick();
};

}  // namespace ddprun::server
