#include "admission.h"

#include <sys/resource.h>

#include <algorithm>

#include "ddprun/rdzv/auth_io.h"
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

bool Admission::is_stranger(const asio::ip::address& peer) const {
  return !is_loopback(peer) && !member_hosts_.count(peer) &&
         std::find(store_peers_.begin(), store_peers_.end(), peer) == store_peers_.end();
}

Admission::Admit Admission::may_connect_locked(uint64_t in_use, const ConnPtr& c,
                                               std::chrono::steady_clock::time_point now) {
  const bool stranger = is_stranger(c->session.peer);
  const bool over_share = stranger && strangers_open_ >= max_strangers_;
  Admit a;
  if (in_use >= max_conns_ || over_share) {
    // No slot: the oldest unproven connection's, if it had its time (a stranger's for a stranger
    // past the strangers' share, so that share still holds).
    a.replaces = replacing_ < kMaxReplacing ? oldest_replaceable(over_share, now) : nullptr;
    if (!a.replaces) {
      refuse(in_use >= max_conns_, in_use, *c);
      return a;
    }
    replace_locked(a.replaces, c->session.peer, now);
  }
  a.ok = true;
  if (stranger) {
    ++strangers_open_;
    c->session.counted_stranger = true;
  }
  c->session.unproven = true;
  unproven_of(*c).emplace(c->id, Unproven{c, now});
  return a;
}

void Admission::refuse(bool over_total, uint64_t in_use, const Connection& c) {
  const std::string from = c.session.peer.to_string();
  if (over_total) {
    ++refused_over_limit_;
    warns_.warn(Warn::ConnectionLimit, [&] {
      return fmt::format("{} descriptors in use by connections and listeners, the limit (--max-connections {} "
                         "within the descriptor limit), none of them unproven for {} ms or more: closed a new "
                         "connection from {}",
                         in_use, max_conns_, kReplaceableAfter.count(), from);
    });
    return;
  }
  ++strangers_refused_;
  warns_.warn(Warn::ConnectionLimit, [&] {
    return fmt::format("{} connections open from hosts with no admitted agent, the limit "
                       "(--max-stranger-connections {}), none of them unproven for {} ms or more: closed a new one "
                       "from {}",
                       strangers_open_, max_strangers_, kReplaceableAfter.count(), from);
  });
}

ConnPtr Admission::oldest_replaceable(bool strangers_only, std::chrono::steady_clock::time_point now) {
  while (true) {
    UnprovenMap* from = nullptr;
    auto consider = [&](UnprovenMap& m) {
      if (!m.empty() && (!from || m.begin()->first < from->begin()->first)) from = &m;
    };
    consider(unproven_strangers_);
    if (!strangers_only) consider(unproven_others_);
    // Ids go in order of accept: when the oldest had not its time, no other had.
    if (!from || now - from->begin()->second.since < kReplaceableAfter) return nullptr;
    if (ConnPtr c = from->begin()->second.conn.lock()) return c;
    from->erase(from->begin());  // gone without a close (cannot happen while the server runs)
  }
}

Admission::Room Admission::make_room_locked(uint64_t in_use, uint64_t n, std::chrono::steady_clock::time_point now) {
  Room room;
  while (in_use + n > max_conns_ + room.replaced.size()) {
    ConnPtr victim = replacing_ < kMaxReplacing ? oldest_replaceable(false, now) : nullptr;
    if (!victim) return room;
    replace_locked(victim, {}, now);
    room.replaced.push_back(std::move(victim));
  }
  room.ok = true;
  return room;
}

void Admission::replace_locked(const ConnPtr& victim, const asio::ip::address& by,
                               std::chrono::steady_clock::time_point now) {
  Session& s = victim->session;
  auto& m = unproven_of(*victim);
  const auto it = m.find(victim->id);
  const auto held = it == m.end() ? std::chrono::steady_clock::duration{} : now - it->second.since;
  if (it != m.end()) m.erase(it);
  s.unproven = false;
  if (s.counted_stranger) {
    --strangers_open_;
    s.counted_stranger = false;
  }
  s.replaced = true;
  ++replacing_;
  ++replaced_;
  warns_.warn(Warn::ConnectionLimit, [&] {
    const std::string what =
        by.is_unspecified() ? std::string("a job's workers' store") : "a new connection from " + by.to_string();
    return fmt::format("no slot for {} (--max-connections {}, --max-stranger-connections {}): closed connection {} "
                       "from {}, which proved nothing in its {} ms, to make room",
                       what, max_conns_, max_strangers_, victim->id, s.peer.to_string(),
                       std::chrono::duration_cast<std::chrono::milliseconds>(held).count());
  });
}

void Admission::proven_locked(Connection& c) {
  if (!c.session.unproven) return;
  unproven_of(c).erase(c.id);
  c.session.unproven = false;
}

void Admission::closed_locked(const Connection& c) {
  if (c.session.unproven) unproven_of(c).erase(c.id);
  if (c.session.counted_stranger) --strangers_open_;
  if (c.session.replaced) --replacing_;
}

void Admission::forget_locked(const Connection& c) {
  auto it = admitted_.find(c.id);
  if (it == admitted_.end()) return;
  if (auto h = member_hosts_.find(it->second); h != member_hosts_.end()) {
    std::erase(h->second, c.id);
    if (h->second.empty()) member_hosts_.erase(h);
  }
  admitted_.erase(it);
}

bool Admission::store_client_allowed_locked(const Keyspace& ks, bool main, const asio::ip::address& peer,
                                            const rdzv::RoundState& rounds) const {
  if (is_loopback(peer)) return true;
  if (main && std::find(store_peers_.begin(), store_peers_.end(), peer) != store_peers_.end()) return true;
  // The agents admitted at this address only: a job's every worker connection must not walk
  // the whole job.
  auto at = member_hosts_.find(peer);
  if (at == member_hosts_.end()) return false;
  for (rdzv::ConnId id : at->second)
    if (main ? rounds.is_participant(id) : rounds.in_round(ks.run_id, id)) return true;
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
  if (step.admitted && admitted_.emplace(c.id, c.session.peer).second) member_hosts_[c.session.peer].push_back(c.id);
  if (step.admitted) proven_locked(c);
  if (step.admitted && c.session.counted_stranger) {
    // A member now: its slot no longer counts against the strangers' limit (a job with more
    // hosts than that limit must still get every agent in, e.g. re-joining after a restart).
    --strangers_open_;
    c.session.counted_stranger = false;
  }
}

rdzv::SessionMac::Verdict Admission::open(Connection& c, rdzv::Message& m) {
  return c.session.mac ? c.session.mac->open(m) : rdzv::SessionMac::Verdict::Ok;
}

bool Admission::authentic_locked(Connection& c, const rdzv::Message& m, rdzv::SessionMac::Verdict v) {
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
