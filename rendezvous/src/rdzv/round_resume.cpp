// RoundState: rounds rebuilt from their agents' re-joins after a restart of a standing server
// (round_state.h, "Resume").
#include <algorithm>

#include "ddprun/rdzv/round_state.h"
#include "round_state_detail.h"

namespace ddprun::rdzv {

using namespace detail;

void RoundState::on_resume(Job& job, ConnId conn, const Join& m, bool created, Clock::time_point now,
                           std::vector<Outbound>& out) {
  if (created) {
    job.phase = Phase::Resuming;
    job.round = m.resume_round;
    job.restart_count = m.resume_restart_count;
    job.resume_nnodes = m.resume_nnodes;
    job.resume_store_port = m.resume_store_port;
    job.resume_store_host = m.resume_store_host;
    job.agent_store = !m.resume_store_host.empty();
    job.agent_progress = false;
    job.join_deadline = now + job.join_timeout;
  } else if (m.resume_round != job.round || m.resume_nnodes != job.resume_nnodes ||
             m.resume_restart_count != job.restart_count || m.resume_store_host != job.resume_store_host ||
             (job.agent_store && m.resume_store_port != job.resume_store_port)) {
    out.push_back({conn, error_msg("cannot resume round " + std::to_string(m.resume_round) + " (" +
                                       std::to_string(m.resume_nnodes) + " nodes) of job " + job.run_id +
                                       ": the nodes back so far resume round " + std::to_string(job.round) + " (" +
                                       std::to_string(job.resume_nnodes) + " nodes)"),
                   true});
    return;
  }
  if (auto h = job.resumed_rank.find(m.resume_node_rank); h != job.resumed_rank.end() && h->second != conn &&
                                                           job.in_round.count(h->second)) {
    if (const Node& other = job.members.at(h->second); other.last_rank == m.resume_node_rank) {
      out.push_back({conn, error_msg("cannot resume node rank " + std::to_string(m.resume_node_rank) + " of job " +
                                         job.run_id + ": " + describe(other) + " resumed it already"),
                     true});
      if (created) jobs_.erase(job.run_id);
      return;
    }
  }
  Node& node = add_member(job, conn, m.local_world_size);
  node.conn = conn;
  node.node_id = m.node_id;
  node.host = m.host;
  node.fixed_rank = m.node_rank;
  if (m.node_rank >= 0) job.rank_holder[m.node_rank] = conn;
  job.resumed_rank[m.resume_node_rank] = conn;
  node.prefer_rank0 = m.prefer_rank0;
  node.store_offer = m.store_offer_port;
  node.seen_from = m.seen_from;
  node.last_rank = m.resume_node_rank;
  node.last_seen = now;
  node.seq = job.seq++;
  conn_job_[conn] = job.run_id;
  add_participant(job, conn);
  if (m.resume_succeeded) job.succeeded.insert(conn);
  if (job.agent_store && m.resume_node_rank == 0 && m.resume_progressed) job.agent_progress = true;
  if (static_cast<int64_t>(job.participants.size()) < job.resume_nnodes) return;

  // Every node of the round is back: it runs again as it did, with no ROUND and no restart.
  std::sort(job.participants.begin(), job.participants.end(),
            [&](ConnId a, ConnId b) { return job.members.at(a).last_rank < job.members.at(b).last_rank; });
  job.world_size = 0;
  for (ConnId c : job.participants) job.world_size += job.members.at(c).local_world_size;
  // An agent-hosted store never left node rank 0: nothing to reopen.
  if (!job.agent_store)
    stores_.reopen(job.run_id, job.round, job.fixed_store_port, static_cast<uint16_t>(job.resume_store_port));
  stores_.resumed(job.run_id, job.round, job.agent_store);
  job.phase = Phase::Running;
  job.join_deadline.reset();
  maybe_done(job, out);
  if (job.phase == Phase::Running && job.deferred_failure) {
    // Reported while the round was being rebuilt (the agent queued it while this server was
    // down): it counts now, as it would have then.
    auto [fconn, f] = *job.deferred_failure;
    job.deferred_failure.reset();
    if (job.members.count(fconn)) on_failure(job, fconn, f, out);
  }
  if (job.phase == Phase::Running && !job.waiting.empty() &&
      static_cast<int64_t>(job.participants.size()) < job.max_nodes)
    restart(job, "a node joined while the round was rebuilt: scale-up to a new round", /*spends_budget=*/false, now,
            out);
}

void RoundState::resume_timed_out(Job& job, Clock::time_point now, std::vector<Outbound>& out) {
  const std::string what = std::to_string(job.participants.size()) + " of the " + std::to_string(job.resume_nnodes) +
                           " nodes of round " + std::to_string(job.round) + " came back within " +
                           std::to_string(job.join_timeout.count() / 1000) +
                           " s after the rendezvous server restarted";
  if (static_cast<int64_t>(job.participants.size()) >= job.min_nodes) {
    job.phase = Phase::Running;  // restart() addresses the round's participants
    restart(job, what + ": a new round with them (no restart spent)", /*spends_budget=*/false, now, out);
  } else {
    fail_job(job, what + ", fewer than the minimum of " + std::to_string(job.min_nodes), FailCause::LostNodes, out);
  }
}

}  // namespace ddprun::rdzv
