#include "ddprun/rdzv/round_state.h"

#include <algorithm>

namespace ddprun::rdzv {

using std::chrono::milliseconds;

namespace {
Message error_msg(const std::string& text) {
  Message m;
  m.type = MsgType::Error;
  m.set("message", text);
  return m;
}
std::string join_list(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}
}  // namespace

std::string RoundState::describe(const Node& n) { return n.node_id + " (host " + n.host + ")"; }

void RoundState::on_message(ConnId conn, const Message& m, Clock::time_point now, std::vector<Outbound>& out) {
  if (m.type == MsgType::Join) {
    on_join(conn, m, now, out);
    return;
  }
  auto cj = conn_job_.find(conn);
  if (cj == conn_job_.end()) {
    out.push_back({conn, error_msg(std::string(msg_type_name(m.type)) + " before JOIN"), true});
    return;
  }
  Job& job = jobs_.at(cj->second);
  job.members.at(conn).last_seen = now;
  switch (m.type) {
    case MsgType::Heartbeat: break;
    case MsgType::Failure: on_failure(job, conn, m, out); break;
    case MsgType::Succeeded: on_succeeded(job, conn, m, out); break;
    case MsgType::Leave: on_disconnect(conn, now, out); break;
    default:
      out.push_back({conn, error_msg(std::string("unexpected message ") + msg_type_name(m.type)), true});
  }
}

void RoundState::on_join(ConnId conn, const Message& m, Clock::time_point now, std::vector<Outbound>& out) {
  const std::string run_id = m.get("run_id");
  const int64_t min_nodes = m.get_int("min_nodes", 1), max_nodes = m.get_int("max_nodes", 1);
  if (run_id.empty() || min_nodes < 1 || max_nodes < min_nodes || m.get_int("local_world_size", 0) < 1) {
    out.push_back({conn, error_msg("JOIN needs run_id, 1 <= min_nodes <= max_nodes and local_world_size >= 1"), true});
    return;
  }
  if (auto cj = conn_job_.find(conn); cj != conn_job_.end() && cj->second != run_id) {
    out.push_back({conn, error_msg("this connection already belongs to job " + cj->second), true});
    return;
  }
  auto [it, created] = jobs_.try_emplace(run_id);
  Job& job = it->second;
  if (created) {
    job.run_id = run_id;
    job.min_nodes = min_nodes;
    job.max_nodes = max_nodes;
    job.max_restarts = m.get_int("max_restarts", 0);
    job.last_call = milliseconds(m.get_int("last_call_ms", 30000));
    job.join_timeout = milliseconds(m.get_int("join_timeout_ms", 600000));
    job.heartbeat_timeout = milliseconds(m.get_int("heartbeat_timeout_ms", 5000));
  } else if (job.min_nodes != min_nodes || job.max_nodes != max_nodes) {
    out.push_back({conn, error_msg("--nnodes mismatch: job " + run_id + " runs with " + std::to_string(job.min_nodes) +
                                       ":" + std::to_string(job.max_nodes) + " nodes, this agent asked for " +
                                       std::to_string(min_nodes) + ":" + std::to_string(max_nodes)),
                   true});
    return;
  }
  if (job.phase == Phase::Finished) {
    out.push_back({conn, error_msg("job " + run_id + " has already finished; use a new --rdzv_id"), true});
    return;
  }
  const int64_t fixed = m.get_int("node_rank", -1);
  if (fixed >= max_nodes) {
    out.push_back({conn, error_msg("--node_rank " + std::to_string(fixed) + " is out of range for " +
                                       std::to_string(max_nodes) + " nodes (0.." + std::to_string(max_nodes - 1) + ")"),
                   true});
    if (created) jobs_.erase(it);
    return;
  }
  if (fixed >= 0) {
    for (const auto& [c, n] : job.members)
      if (c != conn && n.fixed_rank == fixed) {
        out.push_back({conn, error_msg("--node_rank " + std::to_string(fixed) + " is already taken by " + describe(n)), true});
        return;
      }
  }
  Node& node = job.members[conn];
  const bool new_member = node.conn == 0;
  node.conn = conn;
  node.node_id = m.get("node_id");
  node.host = m.get("host");
  node.local_world_size = m.get_int("local_world_size", 1);
  node.fixed_rank = fixed;
  node.prefer_rank0 = m.get("prefer_rank0") == "1";
  node.last_seen = now;
  if (new_member) node.seq = job.seq++;
  conn_job_[conn] = run_id;
  job.waiting.insert(conn);

  const bool is_participant =
      std::find(job.participants.begin(), job.participants.end(), conn) != job.participants.end();
  if (job.phase == Phase::Running && !is_participant) {
    if (static_cast<int64_t>(job.participants.size()) < job.max_nodes) {
      restart(job, "node " + describe(node) + " joined: scale-up to a new round", /*spends_budget=*/false, now, out);
    }
    return;  // a spare when the job is full: it waits for a round with room
  }
  if (!job.join_deadline) job.join_deadline = now + job.join_timeout;
  maybe_complete(job, now, out);
}

void RoundState::maybe_complete(Job& job, Clock::time_point now, std::vector<Outbound>& out) {
  if (job.phase != Phase::Gathering) return;
  const auto n = static_cast<int64_t>(job.waiting.size());
  bool complete = n >= job.max_nodes;
  if (!complete && n >= job.min_nodes && job.round >= 0) {
    // A re-round: don't wait for the last call once every survivor of the last round is back.
    complete = std::all_of(job.participants.begin(), job.participants.end(),
                           [&](ConnId c) { return !job.members.count(c) || job.waiting.count(c); });
  }
  if (!complete && n >= job.min_nodes) {
    if (!job.last_call_deadline) job.last_call_deadline = now + job.last_call;
    complete = now >= *job.last_call_deadline;
  }
  if (complete) complete_round(job, out);
}

void RoundState::complete_round(Job& job, std::vector<Outbound>& out) {
  std::vector<Node*> nodes;
  for (ConnId c : job.waiting) nodes.push_back(&job.members.at(c));
  std::sort(nodes.begin(), nodes.end(), [](const Node* a, const Node* b) {
    auto key = [](const Node* n) {
      // fixed ranks first, in order; then the endpoint host; then previous ranks; then arrival
      return std::make_tuple(n->fixed_rank < 0, n->fixed_rank, !n->prefer_rank0,
                             n->last_rank < 0 ? INT64_MAX : n->last_rank, n->seq);
    };
    return key(a) < key(b);
  });
  if (static_cast<int64_t>(nodes.size()) > job.max_nodes) nodes.resize(job.max_nodes);

  if (job.round >= 0) stores_.close(job.run_id, job.round);
  ++job.round;
  job.participants.clear();
  job.world_size = 0;
  for (Node* n : nodes) {
    job.participants.push_back(n->conn);
    job.waiting.erase(n->conn);
    job.world_size += n->local_world_size;
  }
  const uint16_t port = stores_.open(job.run_id, job.round);
  int64_t base = 0;
  for (size_t r = 0; r < nodes.size(); ++r) {
    Node* n = nodes[r];
    n->last_rank = static_cast<int64_t>(r);
    Message m;
    m.type = MsgType::Round;
    m.set("run_id", job.run_id)
        .set("round", job.round)
        .set("restart_count", job.restart_count)
        .set("max_restarts", job.max_restarts)
        .set("node_rank", static_cast<int64_t>(r))
        .set("nnodes", static_cast<int64_t>(nodes.size()))
        .set("world_size", job.world_size)
        .set("base_rank", base)
        .set("store_port", static_cast<int64_t>(port));
    base += n->local_world_size;
    out.push_back({n->conn, std::move(m)});
  }
  job.phase = Phase::Running;
  job.succeeded.clear();
  job.last_call_deadline.reset();
  job.join_deadline.reset();
}

void RoundState::restart(Job& job, const std::string& reason, bool spends_budget, Clock::time_point now,
                         std::vector<Outbound>& out) {
  if (spends_budget) ++job.restart_count;
  Message m;
  m.type = MsgType::Restart;
  m.set("reason", reason).set("restart_count", job.restart_count).set("round", job.round);
  for (ConnId c : job.participants)
    if (job.members.count(c)) out.push_back({c, m});
  job.phase = Phase::Gathering;
  job.last_call_deadline.reset();
  job.join_deadline = now + job.join_timeout;
  maybe_complete(job, now, out);
}

void RoundState::fail_job(Job& job, const std::string& reason, std::vector<Outbound>& out) {
  Message m;
  m.type = MsgType::JobFailed;
  m.set("reason", reason).set("restart_count", job.restart_count);
  if (job.first_failure)
    for (const auto& [k, v] : job.first_failure->fields) m.set("first_failure." + k, v);
  for (const auto& [c, _] : job.members) out.push_back({c, m});
  job.phase = Phase::Finished;
  if (job.round >= 0) stores_.close(job.run_id, job.round);
}

void RoundState::on_failure(Job& job, ConnId conn, const Message& m, std::vector<Outbound>& out) {
  if (job.phase != Phase::Running || m.get_int("round", -1) != job.round) return;  // stale
  if (std::find(job.participants.begin(), job.participants.end(), conn) == job.participants.end()) return;
  const Node& node = job.members.at(conn);
  if (!job.first_failure) {
    job.first_failure = m;
    job.first_failure->set("node_rank", node.last_rank).set("node_id", node.node_id).set("host", node.host);
  }
  std::string what = "rank " + m.get("global_rank") + " on " + describe(node) + " failed";
  if (!m.get("signal").empty()) what += " (signal " + m.get("signal") + ")";
  else what += " (exit code " + m.get("exit_code") + ")";
  const bool progressed = stores_.progressed(job.run_id, job.round, job.world_size);
  if (!progressed && job.previous_failed_without_progress) {
    fail_job(job, what + " before any progress, as in the attempt before: a deterministic failure, not retried", out);
    return;
  }
  job.previous_failed_without_progress = !progressed;
  if (job.restart_count >= job.max_restarts) {
    fail_job(job, what + "; the restart budget (max_restarts=" + std::to_string(job.max_restarts) + ") is spent", out);
    return;
  }
  restart(job, what, /*spends_budget=*/true, job.members.at(conn).last_seen, out);
}

void RoundState::on_succeeded(Job& job, ConnId conn, const Message& m, std::vector<Outbound>& out) {
  if (job.phase != Phase::Running || m.get_int("round", -1) != job.round) return;
  job.succeeded.insert(conn);
  for (ConnId c : job.participants)
    if (!job.succeeded.count(c)) return;
  Message done;
  done.type = MsgType::JobDone;
  done.set("round", job.round).set("restart_count", job.restart_count);
  for (const auto& [c, _] : job.members) out.push_back({c, done});
  job.phase = Phase::Finished;
  stores_.close(job.run_id, job.round);
}

void RoundState::node_lost(Job& job, ConnId conn, const std::string& why, Clock::time_point now,
                           std::vector<Outbound>& out) {
  const Node node = job.members.at(conn);
  const bool was_participant =
      std::find(job.participants.begin(), job.participants.end(), conn) != job.participants.end();
  job.members.erase(conn);
  job.waiting.erase(conn);
  if (job.phase == Phase::Finished) return;
  if (job.phase == Phase::Gathering) {
    if (job.round >= 0 && was_participant && static_cast<int64_t>(job.members.size()) < job.min_nodes) {
      fail_job(job, "lost node " + describe(node) + " (" + why + "): " + std::to_string(job.members.size()) +
                        " nodes remain, fewer than the minimum of " + std::to_string(job.min_nodes), out);
      return;
    }
    if (static_cast<int64_t>(job.waiting.size()) < job.min_nodes) job.last_call_deadline.reset();
    maybe_complete(job, now, out);
    return;
  }
  if (!was_participant) return;  // a spare went away
  const auto remaining = static_cast<int64_t>(job.members.size());
  if (remaining < job.min_nodes) {
    fail_job(job, "lost node " + describe(node) + " (" + why + "): " + std::to_string(remaining) +
                      " nodes remain, fewer than the minimum of " + std::to_string(job.min_nodes), out);
    return;
  }
  if (job.restart_count >= job.max_restarts) {
    fail_job(job, "lost node " + describe(node) + " (" + why + "); the restart budget (max_restarts=" +
                      std::to_string(job.max_restarts) + ") is spent", out);
    return;
  }
  restart(job, "lost node " + describe(node) + " (" + why + ")", /*spends_budget=*/true, now, out);
}

void RoundState::on_disconnect(ConnId conn, Clock::time_point now, std::vector<Outbound>& out) {
  auto cj = conn_job_.find(conn);
  if (cj == conn_job_.end()) return;
  auto jit = jobs_.find(cj->second);
  conn_job_.erase(cj);
  Job& job = jit->second;
  if (job.members.count(conn)) node_lost(job, conn, "connection closed", now, out);
  if (job.members.empty()) {
    if (job.phase != Phase::Finished && job.round >= 0) stores_.close(job.run_id, job.round);
    jobs_.erase(jit);
  }
}

void RoundState::on_tick(Clock::time_point now, std::vector<Outbound>& out) {
  std::vector<ConnId> expired;
  for (auto& [id, job] : jobs_) {
    for (const auto& [c, n] : job.members)
      if (now - n.last_seen > job.heartbeat_timeout) expired.push_back(c);
  }
  for (ConnId c : expired) {
    auto cj = conn_job_.find(c);
    if (cj == conn_job_.end()) continue;
    Job& job = jobs_.at(cj->second);
    out.push_back({c, error_msg("no heartbeat for " + std::to_string(job.heartbeat_timeout.count()) +
                                    " ms: dropped from the job"),
                   true});
    const std::string run_id = cj->second;
    conn_job_.erase(cj);
    if (job.members.count(c)) node_lost(job, c, "heartbeat timeout", now, out);
    if (job.members.empty()) jobs_.erase(run_id);
  }
  for (auto& [id, job] : jobs_) {
    if (job.phase != Phase::Gathering) continue;
    if (job.last_call_deadline && now >= *job.last_call_deadline) {
      maybe_complete(job, now, out);
      if (job.phase != Phase::Gathering) continue;
    }
    if (job.join_deadline && now >= *job.join_deadline) {
      std::vector<std::string> who;
      for (ConnId c : job.waiting) who.push_back(job.members.at(c).host);
      const std::string text = "rendezvous timed out after " +
                               std::to_string(job.join_timeout.count() / 1000.0).substr(0, 6) + " s: " +
                               std::to_string(job.waiting.size()) + " of at least " + std::to_string(job.min_nodes) +
                               " nodes joined job " + job.run_id + (who.empty() ? "" : " (" + join_list(who) + ")");
      for (ConnId c : job.waiting) out.push_back({c, error_msg(text), true});
      fail_job(job, text, out);
    }
  }
}

std::optional<Clock::time_point> RoundState::next_deadline() const {
  std::optional<Clock::time_point> best;
  auto consider = [&](Clock::time_point t) {
    if (!best || t < *best) best = t;
  };
  for (const auto& [id, job] : jobs_) {
    if (job.last_call_deadline) consider(*job.last_call_deadline);
    if (job.join_deadline) consider(*job.join_deadline);
  }
  return best;
}

}  // namespace ddprun::rdzv
