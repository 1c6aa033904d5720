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
}

bool Admission::may_connect(uint64_t open, const asio::ip::address& peer) {
  if (open < max_conns_) return true;
  ++refused_over_limit_;
  warns_.warn(Warn::ConnectionLimit, [&] {
    return fmt::format("{} connections open, the limit (--max-connections {} within the descriptor limit): "
                       "closed a new one from {}",
                       open, max_conns_, peer.is_unspecified() ? std::string("?") : peer.to_string());
  });
  return false;
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

rdzv::ServerHandshake::Step Admission::on_handshake_locked(Connection& c, const rdzv::Message& m) {
  auto step = c.session.handshake->on_message(m);
  if (step.refused) {
    ++agents_refused_;
    warns_.warn(Warn::AgentRefused,
                [&] { return fmt::format("refused an agent from {}: {}", c.session.peer.to_string(), step.why); });
    return step;
  }
  c.session.admitted = step.admitted;
  c.session.mac = std::move(step.session);
  if (step.admitted) admitted_[c.id] = c.session.peer;
  return step;
}

bool Admission::authentic_locked(Connection& c, rdzv::Message& m) {
  if (!c.session.mac) return true;
  const auto v = c.session.mac->open(m);
  if (v == rdzv::SessionMac::Verdict::Ok) return true;
  ++agents_refused_;
  warns_.warn(Warn::AgentRefused, [&] {
    return fmt::format("dropped {} from agent connection {} ({}): {}", rdzv::msg_type_name(m.type), c.id,
                       c.session.peer.to_string(), rdzv::SessionMac::describe(v));
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
