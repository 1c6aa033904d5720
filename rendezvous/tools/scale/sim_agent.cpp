// A simulated agent: what the launcher's remote coordinator does on the wire, from the
// connection to the ROUND, then its node's workers (sim.h).
#include <arpa/inet.h>

#include <cstdio>
#include <cstring>

#include "ddprun/rdzv/auth_io.h"
#include "sim.h"

namespace ddprun::scale {

Shared::Shared(const Options& opts) : o(opts) {}

int64_t Shared::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

void Shared::mark(std::atomic<int64_t>& t) const {
  const int64_t now = now_ns();
  int64_t seen = t.load();
  while (seen < now && !t.compare_exchange_weak(seen, now)) {
  }
}

void Shared::error(const std::string& what) {
  if (errors.fetch_add(1) < 10) std::fprintf(stderr, "ddprun_scale_sim: %s\n", what.c_str());
}

void Agent::start(Loop& loop, const sockaddr_in& server) {
  server_ = server;
  if (!loop.connect(*this, server, s_.o.source_ips ? node_address(index_) : 0))
    s_.error("agent " + std::to_string(index_) + ": connect: " + std::strerror(errno));
}

void Agent::on_connected(Loop& loop) {
  std::string b;
  wire::Writer(b).u8(0).u32(rdzv::kAgentMagic);
  if (s_.o.token.empty()) {
    loop.send(*this, b);
    on_handshaken(loop);
    return;
  }
  hs_.emplace(s_.o.token, rdzv::random_nonce(), s_.o.host + ":" + std::to_string(s_.o.port));
  rdzv::encode_message(hs_->hello(), b);
  loop.send(*this, b);
}

void Agent::write(Loop& loop, rdzv::Message m) {
  if (mac_) mac_->seal(m);
  std::string b;
  rdzv::encode_message(m, b);
  loop.send(*this, b);
}

rdzv::Join Agent::join_message() const {
  const std::string host = s_.o.source_ips ? address_text(node_address(index_)) : std::string("127.0.0.1");
  return rdzv::Join{.run_id = s_.o.run_id,
                    .node_id = "sim" + std::to_string(index_),
                    .host = host,
                    .local_world_size = s_.o.nproc,
                    .min_nodes = s_.o.min_nodes > 0 ? s_.o.min_nodes : s_.o.agents,
                    .max_nodes = s_.o.agents,
                    .max_restarts = 3,
                    .last_call_ms = 30000,
                    .join_timeout_ms = 600000,
                    .heartbeat_timeout_ms = 120000,
                    .store_offer_port = s_.o.store_offer_port};
}

void Agent::send_join(Loop& loop, bool again) {
  if (!again) s_.mark(s_.t_first_join);  // the first agent's mark is the earliest; later ones only raise it
  write(loop, rdzv::to_message(join_message()));
}

void Agent::heartbeat(Loop& loop) {
  if (fd >= 0 && handshaken_) write(loop, rdzv::to_message(rdzv::Heartbeat{}));
}

void Agent::on_readable(Loop& loop) {
  size_t off = 0;
  while (fd >= 0) {
    rdzv::Message m;
    const auto r = rdzv::parse_message({in.data() + off, in.size() - off}, m);
    if (r.status == wire::ParseStatus::NeedMore) break;
    if (r.status == wire::ParseStatus::Bad) {
      s_.error("agent " + std::to_string(index_) + ": a frame that does not parse");
      loop.close(*this);
      return;
    }
    off += r.consumed;
    on_message(loop, m);
  }
  in.erase(in.begin(), in.begin() + static_cast<long>(off));
}

void Agent::on_message(Loop& loop, const rdzv::Message& m) {
  if (!handshaken_) {
    try {
      if (auto next = hs_->on_reply(m)) {
        std::string b;
        rdzv::encode_message(*next, b);
        loop.send(*this, b);
      }
    } catch (const std::exception& e) {
      loop.close(*this);
      // Reconnecting, whatever answers on the port is not the server yet: again later.
      if (reconnecting_) lost(loop);
      else s_.error("agent " + std::to_string(index_) + ": handshake: " + e.what());
      return;
    }
    if (hs_->done()) {
      mac_ = hs_->session();
      on_handshaken(loop);
    }
    return;
  }
  rdzv::Message opened = m;
  if (mac_ && mac_->open(opened) != rdzv::SessionMac::Verdict::Ok) {
    s_.error("agent " + std::to_string(index_) + ": a " + rdzv::msg_type_name(m.type) + " whose MAC does not check");
    loop.close(*this);
    return;
  }
  if (opened.type == rdzv::MsgType::Round) {
    on_round(loop, rdzv::from_message<rdzv::Round>(opened));
    return;
  }
  if (opened.type == rdzv::MsgType::Restart) {
    on_restart(loop);
    return;
  }
  if (opened.type == rdzv::MsgType::JobDone) {
    finished_ = true;
    s_.jobs_done.fetch_add(1);
    s_.mark(s_.t_last_job_done);
    return;
  }
  if (opened.type == rdzv::MsgType::Error) {
    s_.error("agent " + std::to_string(index_) + ": ERROR: " + rdzv::from_message<rdzv::Error>(opened).message);
    return;
  }
  s_.error("agent " + std::to_string(index_) + ": unexpected " + rdzv::msg_type_name(opened.type));
}

void Agent::on_round(Loop& loop, const rdzv::Round& r) {
  if (got_round_) {
    s_.error("agent " + std::to_string(index_) + ": a second ROUND (round " + std::to_string(r.round) + ")");
    return;
  }
  got_round_ = true;
  last_round_ = r;
  s_.rounds.fetch_add(1);
  s_.mark(s_.t_last_round);
  int64_t expect = -1;
  if (s_.tally_rounds.load()) s_.on_agent_round(index_, r);  // rounds of several sizes follow each other
  else if (!s_.world_size.compare_exchange_strong(expect, r.world_size) && expect != r.world_size)
    s_.error("agent " + std::to_string(index_) + ": world size " + std::to_string(r.world_size) + ", others got " +
             std::to_string(expect));
  if (!s_.o.workers) return;
  // The workers reach the store where the ROUND says: node rank 0's agent (store_host) or the
  // rendezvous server's address.
  sockaddr_in store = server_;
  const bool elsewhere = s_.o.store_at_port > 0;
  const std::string& host = elsewhere ? s_.o.store_at_host : r.store_host;
  store.sin_port = htons(static_cast<uint16_t>(elsewhere ? s_.o.store_at_port : r.store_port));
  if (!host.empty() && inet_pton(AF_INET, host.c_str(), &store.sin_addr) != 1) {
    s_.error("agent " + std::to_string(index_) + ": store host " + host + " is no IPv4 address");
    return;
  }
  const uint32_t source = s_.o.source_ips ? node_address(index_) : 0;
  if (s_.o.relay) relay_ = std::make_unique<RelayLink>(s_, index_);
  for (int64_t local = 0; local < s_.o.nproc; ++local) {
    workers_.push_back(std::make_unique<Worker>(s_, r.round, r.base_rank + local, r.world_size, source));
    if (relay_) relay_->add(*workers_.back());
    workers_.back()->start(loop, store);
  }
  if (relay_) relay_->start(loop, store, source);
}

void Agent::stop_workers(Loop& loop) {
  if (relay_) loop.close(*relay_);  // its workers own no socket
  relay_.reset();
  for (auto& w : workers_) loop.close(*w);
  workers_.clear();
}

void Agent::die(Loop& loop) {
  dead_ = true;
  stop_workers(loop);
  loop.close(*this);
}

void Agent::on_restart(Loop& loop) {
  s_.restarts.fetch_add(1);
  s_.mark(s_.t_last_restart);
  stop_workers(loop);
  got_round_ = false;
  send_join(loop, true);
}

void Agent::on_handshaken(Loop& loop) {
  handshaken_ = true;
  s_.handshaken.fetch_add(1);
  if (!join_on_handshake_) return;
  join_on_handshake_ = false;
  if (resuming_) rejoin(loop);
  else send_join(loop, true);
}

void Agent::on_failed(Loop& loop, int err) {
  if (s_.stop.load() || dead_ || finished_) return;
  if (s_.o.expect_restart && (got_round_ || reconnecting_)) {
    lost(loop);
    return;
  }
  s_.error("agent " + std::to_string(index_) + ": connection " +
           (err ? std::string("failed: ") + std::strerror(err) : std::string("closed by the server")));
}

}  // namespace ddprun::scale
