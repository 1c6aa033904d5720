#include "admission.h"

#include <sys/resource.h>

#include <algorithm>

#include "keyspaces.h"

namespace ddprun::server {

namespace asio = boost::asio;

namespace {
// Descriptors kept out of --max-connections: listeners of the jobs' stores, logs, pipes.
constexpr uint64_t kReservedDescriptors = 64;
}  // namespace

asio::ip::address plain_address(const asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a;
}

bool is_loopback(const asio::ip::address& a) {
  return a.is_loopback() || (a.is_v4() && (a.to_v4().to_uint() >> 24) == 127);
}

void Admission::size_to_descriptors() {
  rlimit rl{};
  uint64_t fds = UINT64_MAX;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    fds = rl.rlim_cur > 2 * kReservedDescriptors ? rl.rlim_cur - kReservedDescriptors : rl.rlim_cur / 2;
  max_conns_ = std::min<uint64_t>(options_.max_connections, fds);
  max_strangers_ = options_.max_stranger_connections > 0 ? std::min(options_.max_stranger_connections, max_conns_)
                                                         : std::max<uint64_t>(1, max_conns_ / 2);
}

bool Admission::may_connect_locked(uint64_t in_use, Connection& c) {
  const auto& peer = c.session.peer;
  const std::string from = peer.is_unspecified() ? std::string("?") : peer.to_string();
  if (in_use >= max_conns_) {
    ++refused_over_limit_;
    warns_.warn(Warn::ConnectionLimit, [&] {
      return fmt::format("{} descriptors in use by connections and listeners, the limit (--max-connections {} within "
                         "the descriptor limit): closed a new connection from {}",
                         in_use, max_conns_, from);
    });
    return false;
  }
  if (is_loopback(peer) || member_hosts_.count(peer)) return true;
  if (strangers_open_ >= max_strangers_) {
    ++strangers_refused_;
    warns_.warn(Warn::ConnectionLimit, [&] {
      return fmt::format("{} connections open from hosts with no admitted agent, the limit "
                         "(--max-stranger-connections {}): closed a new one from {}",
                         strangers_open_, max_strangers_, from);
    });
    return false;
  }
  ++strangers_open_;
  c.session.counted_stranger = true;
  return true;
}

void Admission::closed_locked(const Connection& c) {
  if (c.session.counted_stranger) --strangers_open_;
}

void Admission::forget_locked(const Connection& c) {
  auto it = admitted_.find(c.id);
  if (it == admitted_.end()) return;
  auto h = member_hosts_.find(it->second);
  if (h != member_hosts_.end() && --h->second == 0) member_hosts_.erase(h);
  admitted_.erase(it);
}

bool Admission::admitted_agent_at(rdzv::ConnId id, const asio::ip::address& peer) const {
  auto it = admitted_.find(id);
  return it != admitted_.end() && it->second == peer;
}

bool Admission::store_client_allowed_locked(const Keyspace& ks, bool main, const asio::ip::address& peer,
                                            const rdzv::RoundState& rounds) const {
  if (is_loopback(peer)) return true;
  if (!main) {
    for (rdzv::ConnId id : rounds.participants(ks.run_id))
      if (admitted_agent_at(id, peer)) return true;
    return false;
  }
  if (std::find(store_peers_.begin(), store_peers_.end(), peer) != store_peers_.end()) return true;
  for (const auto& [id, at] : admitted_)
    if (at == peer && rounds.is_participant(id)) return true;
  return false;
}

void Admission::refused_store_client(const std::string& store_name, const asio::ip::address& peer, bool workers_store) {
  ++store_strangers_;
  warns_.warn(Warn::StoreStranger, [&] {
    if (workers_store)
      return fmt::format("closed a TCPStore connection from {}: only loopback and the nodes of the "
                         "job's current round may use the workers' store",
                         peer.to_string());
    return fmt::format("closed a connection to the {} store from {}: only loopback and the nodes of the "
                       "job's current round may use it",
                       store_name, peer.to_string());
  });
}

void Admission::begin_agent(Connection& c) {
  c.session.protocol = wire::Protocol::Agent;
  c.session.agent = true;
  c.session.handshake.emplace(options_.rdzv_token, rdzv::random_nonce(), options_.standing, options_.rdzv_munge);
}

rdzv::ServerHandshake::Step Admission::handshake_step(Connection& c, const rdzv::Message& m) {
  return c.session.handshake->on_message(m);
}

void Admission::on_handshake_locked(Connection& c, rdzv::ServerHandshake::Step& step) {
  if (step.refused) {
    ++agents_refused_;
    warns_.warn(Warn::AgentRefused,
                [&] { return fmt::format("refused an agent from {}: {}", c.session.peer.to_string(), step.why); });
    return;
  }
  c.session.admitted = step.admitted;
  c.session.mac = std::move(step.session);
  if (step.admitted && admitted_.emplace(c.id, c.session.peer).second) ++member_hosts_[c.session.peer];
  if (step.admitted && c.session.counted_stranger) {
    // A member now: its slot no longer counts against the strangers' limit (a job with more
    // hosts than that limit must still get every agent in, e.g. re-joining after a restart).
    --strangers_open_;
    c.session.counted_stranger = false;
  }
}

bool Admission::authentic_locked(Connection& c, rdzv::Message& m) {
  if (!c.session.mac) return true;
  const auto v = c.session.mac->open(m);
  if (v == rdzv::SessionMac::Verdict::Ok) return true;
  ++agents_refused_;
  warns_.warn(Warn::AgentRefused, [&] {
    return fmt::format("dropped {} from agent connection {} ({}): {}; closed the connection",
                       rdzv::msg_type_name(m.type), c.id, c.session.peer.to_string(), rdzv::SessionMac::describe(v));
  });
  return false;
}

std::vector<std::string> Admission::set_store_peers_locked(const std::vector<std::string>& addresses) {
  std::vector<asio::ip::address> parsed;
  std::vector<std::string> skipped;
  for (const auto& a : addresses) {
    boost::system::error_code ec;
    const auto addr = asio::ip::make_address(a, ec);
    if (ec) skipped.push_back(a);
    else parsed.push_back(plain_address(addr));
  }
  store_peers_ = std::move(parsed);
  return skipped;
}

}  // namespace ddprun::server
