// Admission: the one object that answers "may this peer do this now?". It holds the
// connection limit (within the descriptor limit), the stranger filter of the TCPStore
// keyspaces, the agents' token handshake and the register of admitted agents that the filter
// trusts.
//
// Slots. A connection is unproven from its accept until it proves something: an agent that
// the token handshake admitted, or a TCPStore client that made a request (VALIDATE is none).
// Unproven connections have deadlines (--first-bytes-timeout-ms, --handshake-timeout-ms) and
// hold their slots only on probation: when a new connection finds no slot (--max-connections,
// or a stranger's past --max-stranger-connections), it takes the slot of the oldest unproven
// connection (the oldest unproven stranger's for a stranger) that has been open at least
// kReplaceableAfter, which is closed. So connections that prove nothing (silent, half-open,
// VALIDATE only, a wrong token) cannot keep out an agent that proves the token, from any host,
// loopback or not; only a burst of more new connections within kReplaceableAfter than there
// are unproven slots is refused (a connection flood).
//
// Locking: the *_locked methods and the register are under the server's rounds lock; the
// counters are atomic; may_connect() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
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

// How long an unproven connection holds its slot for sure: past it, a new connection may take it.
inline constexpr std::chrono::milliseconds kReplaceableAfter{1000};
// Replaced connections whose close is still on its way: at most this many more descriptors than
// --max-connections are open for a moment (within the descriptors kept out of it).
inline constexpr uint64_t kMaxReplacing = 16;

class Admission {
 public:
  Admission(const StoreServerOptions& options, WarnLimiter& warns) : options_(options), warns_(warns) {}

  // At start(): --max-connections within this process's descriptor limit, less a reserve.
  void size_to_descriptors();
  uint64_t max_connections() const { return max_conns_; }
  // Under the lock: a new connection c (its id and peer set) while `in_use` descriptors
  // (connections and listeners) are open. Not `ok`: close it now (counted, logged). `replaces`:
  // the unproven connection whose slot c takes; the caller closes it. A stranger (neither
  // loopback, nor the host of an admitted agent, nor a store peer) counts as one until it
  // closes (closed_locked()); c is unproven until proven_locked().
  struct Admit {
    bool ok = false;
    ConnPtr replaces;
  };
  Admit may_connect_locked(uint64_t in_use, const ConnPtr& c, std::chrono::steady_clock::time_point now);
  // Under the lock: `n` descriptors more than the limit allows are wanted (a round's store's
  // listeners) while `in_use` are open: the unproven connections whose slots they take (the
  // caller closes them), `ok` when they make room for all n.
  struct Room {
    bool ok = false;
    std::vector<ConnPtr> replaced;
  };
  Room make_room_locked(uint64_t in_use, uint64_t n, std::chrono::steady_clock::time_point now);
  // Under the lock: c proved itself (an admitted agent, a TCPStore client's first request): its
  // slot is its own until it closes.
  void proven_locked(Connection& c);
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
  bool authentic_locked(Connection& c, rdzv::Message& m) { return authentic_locked(c, m, open(c, m)); }
  // The check itself, on c's own thread without the lock: the receiving side of c's session
  // (its key and sequence number) is c's thread's alone; the sending side is sealed elsewhere.
  static rdzv::SessionMac::Verdict open(Connection& c, rdzv::Message& m);
  // Under the lock: its verdict counted and logged when it is not Ok.
  bool authentic_locked(Connection& c, const rdzv::Message& m, rdzv::SessionMac::Verdict v);
  // Under the lock: the agent c is gone.
  void forget_locked(const Connection& c);

  // Replaces the extra addresses of the main keyspace; returns those that are no IP address.
  std::vector<std::string> set_store_peers_locked(const std::vector<std::string>& addresses);

  uint64_t refused_over_limit() const { return refused_over_limit_; }
  uint64_t agents_refused() const { return agents_refused_; }
  uint64_t store_strangers() const { return store_strangers_; }
  uint64_t strangers_refused() const { return strangers_refused_; }
  uint64_t max_strangers() const { return max_strangers_; }
  uint64_t replaced() const { return replaced_; }

 private:
  bool is_stranger(const boost::asio::ip::address& peer) const;
  // The oldest unproven connection (only strangers: `strangers_only`) open since kReplaceableAfter.
  ConnPtr oldest_replaceable(bool strangers_only, std::chrono::steady_clock::time_point now);
  // `by`: the peer whose connection takes the slot; unspecified for a round's store.
  void replace_locked(const ConnPtr& victim, const boost::asio::ip::address& by,
                      std::chrono::steady_clock::time_point now);
  // Counts and logs a refused connection.
  void refuse(bool over_total, uint64_t in_use, const Connection& c);

  struct Unproven {
    std::weak_ptr<Connection> conn;
    std::chrono::steady_clock::time_point since;
  };
  // By id, which is in order of accept: the first is the oldest.
  using UnprovenMap = std::map<rdzv::ConnId, Unproven>;
  UnprovenMap& unproven_of(const Connection& c) {
    return c.session.counted_stranger ? unproven_strangers_ : unproven_others_;
  }

  const StoreServerOptions& options_;
  WarnLimiter& warns_;
  uint64_t max_conns_ = 0, max_strangers_ = 0, strangers_open_ = 0, replacing_ = 0;
  UnprovenMap unproven_strangers_, unproven_others_;
  // The admitted agents at each address: a store client's check looks up its own address.
  std::map<boost::asio::ip::address, std::vector<rdzv::ConnId>> member_hosts_;
  std::unordered_map<rdzv::ConnId, boost::asio::ip::address> admitted_;  // admitted agents' peers
  std::vector<boost::asio::ip::address> store_peers_;
  std::atomic<uint64_t> refused_over_limit_{0}, agents_refused_{0}, store_strangers_{0}, strangers_refused_{0},
      replaced_{0};
};

}  // namespace ddprun::server
