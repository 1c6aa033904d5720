// What a simulated agent does when nodes come and go (--churn) and when the standing server
// restarts under it (--expect-restart), and the per-round tally that checks the rounds that
// follow (sim.h).
#include <algorithm>
#include <cstring>

#include "sim.h"

namespace ddprun::scale {

void Shared::on_agent_round(int64_t index, const rdzv::Round& r) {
  std::lock_guard lock(tally_mu);
  RoundTally& t = tally[r.round];
  ++t.agents;
  t.t_last_round = std::max(t.t_last_round, now_ns());
  if (t.world < 0) {
    t.world = r.world_size;
    t.restart_count = r.restart_count;
    t.seen.assign(static_cast<size_t>(std::max<int64_t>(r.world_size, 0)), 0);
  } else if (t.world != r.world_size) {
    error("agent " + std::to_string(index) + ": round " + std::to_string(r.round) + " of world size " +
          std::to_string(r.world_size) + ", others got " + std::to_string(t.world));
  }
}

void Shared::on_worker_done(int64_t round, int64_t rank, int64_t world) {
  std::lock_guard lock(tally_mu);
  RoundTally& t = tally[round];
  if (rank < 0 || rank >= world || world != t.world) {
    error("worker rank " + std::to_string(rank) + " of round " + std::to_string(round) + " is outside its world of " +
          std::to_string(t.world));
    return;
  }
  if (t.seen[static_cast<size_t>(rank)]++) ++t.dup_ranks;
  ++t.done;
  t.t_last_done = std::max(t.t_last_done, now_ns());
}

void Agent::start_late(Loop& loop, const sockaddr_in& server) {
  join_on_handshake_ = true;
  start(loop, server);
}

// A node that goes: with a LEAVE (the agent stops, as on a stop signal) or without (its host
// went away). Its workers go with it.
void Agent::leave(Loop& loop, bool say_leave) {
  if (say_leave && fd >= 0 && handshaken_) write(loop, rdzv::to_message(rdzv::Leave{}));
  dead_ = true;
  stop_workers(loop);
  loop.close(*this);
}

// The launcher's reconnector: the first attempt at once, then 50 ms doubling to 500 ms; the
// workers keep running (their store is node rank 0's, which the server's death leaves alone).
void Agent::lost(Loop& loop) {
  loop.close(*this);
  handshaken_ = false;
  mac_.reset();
  if (!reconnecting_) {
    int64_t none = 0;
    s_.t_first_loss.compare_exchange_strong(none, s_.now_ns());
    s_.lost.fetch_add(1);
    reconnecting_ = true;
    resuming_ = got_round_;
    backoff_ms_ = 50;
    reconnect_at_ = Clock::now();
    return;
  }
  reconnect_at_ = Clock::now() + std::chrono::milliseconds(backoff_ms_);
  backoff_ms_ = std::min(backoff_ms_ * 2, 500);
}

void Agent::tick(Loop& loop, Clock::time_point now) {
  if (!reconnecting_ || fd >= 0 || now < reconnect_at_) return;
  s_.attempts.fetch_add(1);
  join_on_handshake_ = true;
  // Nothing of the last connection stays (a relay's queued hello is why the loop keeps `out`).
  connected = false;
  in.clear();
  out.clear();
  out_off = 0;
  if (!loop.connect(*this, server_, s_.o.source_ips ? node_address(index_) : 0)) lost(loop);
}

// Connected again while its round runs: JOIN with the round as this agent knows it, as the
// launcher's agent re-joins (remote_coordinator.cpp). The server sends no ROUND when the round
// is whole again; so that the simulator sees that moment, the agent then reports its workers
// succeeded (as if the job ended right then): the server holds SUCCEEDED until the round is
// whole, then sends JOB_DONE to every agent.
void Agent::rejoin(Loop& loop) {
  reconnecting_ = false;
  rdzv::Join j = join_message();
  j.resume_round = last_round_.round;
  j.resume_restart_count = last_round_.restart_count;
  j.resume_node_rank = last_round_.node_rank;
  j.resume_nnodes = last_round_.nnodes;
  j.resume_store_port = last_round_.store_port;
  j.resume_succeeded = false;
  j.resume_store_host = last_round_.store_host;
  // Node rank 0 hosting the store saw every worker join it (they are all through).
  j.resume_progressed = !last_round_.store_host.empty() && last_round_.node_rank == 0;
  write(loop, rdzv::to_message(j));
  s_.rejoined.fetch_add(1);
  s_.mark(s_.t_last_rejoin);
  write(loop, rdzv::to_message(rdzv::Succeeded{.round = last_round_.round}));
}

void Agent::recheck(Loop& loop) {
  for (auto& w : workers_) w->recheck(loop);
}

}  // namespace ddprun::scale
