// Admission: the one object that answers "may this peer do this now?". It holds the
// connection limit (within the descriptor limit), the stranger filter of the TCPStore
// keyspaces, the agents' token handshake and the register of admitted agents that the filter
// trusts.
//
// Locking: the *_locked methods and the register are under the server's rounds lock; the
// counters are atomic; may_connect() may be called from any thread.
#pragma once

#include <atomic>
#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "connection.h"
#include "ddprun/rdzv/round_state.h"
#include "ddprun/server/store_server.h"
#include "server_log.h"

namespace ddprun::server {

struct Keyspace;

// IPv4 peers of a dual-stack listener show as ::ffff:a.b.c.d: compare them as IPv4.
boost::asio::ip::address plain_address(const boost::asio::ip::address& a);
bool is_loopback(const boost::asio::ip::address& a);

class Admission {
 public:
  Admission(const StoreServerOptions& options, WarnLimiter& warns) : options_(options), warns_(warns) {}

  // At start(): --max-connections within this process's descriptor limit, less a reserve.
  void size_to_descriptors();
  uint64_t max_connections() const { return max_conns_; }
  // Under the lock: a new connection c while `in_use` descriptors (connections and listeners)
  // are open: false = close it now (counted, logged). A stranger (neither loopback nor the
  // host of an admitted agent) is counted as one until it closes (closed_locked()).
  bool may_connect_locked(uint64_t in_use, Connection& c);
  // Under the lock: c is gone.
  void closed_locked(const Connection& c);

  // Under the lock: whether a TCPStore client from `peer` may use `ks`. A round's store:
  // loopback or an agent of the job's current round. The main keyspace (when restricted):
  // also set_store_peers()' addresses and any admitted agent in a current round.
  bool store_client_allowed_locked(const Keyspace& ks, bool main, const boost::asio::ip::address& peer,
                                   const rdzv::RoundState& rounds) const;
  // A TCPStore connection refused by the filter: counted and logged (rate-limited).
  void refused_store_client(const std::string& store_name, const boost::asio::ip::address& peer, bool workers_store);

  // An agent announced itself on connection c: its handshake starts.
  void begin_agent(Connection& c);
  // One message of an agent not admitted yet, on c's thread WITHOUT the lock: the handshake is
  // c's own, and checking a munge credential asks munged (a round trip that must not hold up
  // other agents' messages).
  rdzv::ServerHandshake::Step handshake_step(Connection& c, const rdzv::Message& m);
  // Then under the lock: what the step changes in the register. A refusal is counted and logged.
  void on_handshake_locked(Connection& c, rdzv::ServerHandshake::Step& step);
  // Under the lock: whether a message of an admitted agent is its own (its MAC and sequence
  // number check, when its session has them); one that is not is counted, logged, dropped, and
  // the caller closes the connection.
  bool authentic_locked(Connection& c, rdzv::Message& m);
  // Under the lock: the agent c is gone.
  void forget_locked(const Connection& c);

  // Replaces the extra addresses of the main keyspace; returns those that are no IP address.
  std::vector<std::string> set_store_peers_locked(const std::vector<std::string>& addresses);

  uint64_t refused_over_limit() const { return refused_over_limit_; }
  uint64_t agents_refused() const { return agents_refused_; }
  uint64_t store_strangers() const { return store_strangers_; }
  uint64_t strangers_refused() const { return strangers_refused_; }
  uint64_t max_strangers() const { return max_strangers_; }

 private:
  bool admitted_agent_at(rdzv::ConnId id, const boost::asio::ip::address& peer) const;

  const StoreServerOptions& options_;
  WarnLimiter& warns_;
  uint64_t max_conns_ = 0, max_strangers_ = 0, strangers_open_ = 0;
  std::map<boost::asio::ip::address, uint64_t> member_hosts_;  // admitted agents per address
  std::unordered_map<rdzv::ConnId, boost::asio::ip::address> admitted_;  // admitted agents' peers
  std::vector<boost::asio::ip::address> store_peers_;
  std::atomic<uint64_t> refused_over_limit_{0}, agents_refused_{0}, store_strangers_{0}, strangers_refused_{0};
};

}  // namespace ddprun::server
