#include "ddprun/rdzv/round_state.h"

#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <type_traits>

#include "ddprun/rdzv/validate.h"
#include "round_state_detail.h"

namespace ddprun::rdzv {

using std::chrono::milliseconds;
using namespace detail;

// Deferred, one shared copy: a broadcast to 16,000 agents made 16,000 copies of its message
// (a map of strings each) under the server's lock.
template <class Conns, class To>
void RoundState::broadcast(const Conns& conns, Message m, To to, std::vector<Outbound>& out) const {
  auto conn_of = [](const auto& e) {
    if constexpr (std::is_same_v<std::decay_t<decltype(e)>, ConnId>) return e;
    else return e.first;
  };
  out.reserve(out.size() + conns.size());
  if (!deferred_rounds_) {
    for (const auto& e : conns)
      if (to(conn_of(e))) out.push_back({conn_of(e), m});
    return;
  }
  auto shared = std::make_shared<const Message>(std::move(m));
  for (const auto& e : conns)
    if (to(conn_of(e))) out.push_back({conn_of(e), Message{shared->type, {}}, false, nullptr, 0, 0, shared});
}

void RoundState::on_join(ConnId conn, const Join& m, Clock::time_point now, std::vector<Outbound>& out) {
  const std::string& run_id = m.run_id;
  const int64_t min_nodes = m.min_nodes, max_nodes = m.max_nodes;
  // Every field in bounds before anything is stored: what a JOIN says reaches the workers'
  // environment and every node's console.
  if (auto why = check_join(m)) {
    out.push_back({conn, error_msg(*why), true});
    return;
  }
  if (auto cj = conn_job_.find(conn); cj != conn_job_.end() && cj->second != run_id) {
    out.push_back({conn, error_msg("this connection already belongs to job " + cj->second), true});
    return;
  }
  if (jobs_.empty()) last_tick_.reset();  // no tick was owed while no job existed
  auto [it, created] = jobs_.try_emplace(run_id);
  Job& job = it->second;
  if (created) {
    job.run_id = run_id;
    job.min_nodes = min_nodes;
    job.max_nodes = max_nodes;
    job.max_restarts = m.max_restarts;
    job.retry_deterministic = m.retry_deterministic;
    job.fixed_store_port = m.fixed_store_port;
    job.last_call = milliseconds(m.last_call_ms);
    job.join_timeout = milliseconds(m.join_timeout_ms);
    job.heartbeat_timeout = milliseconds(m.heartbeat_timeout_ms);
  } else {
    // Job-wide settings are the first joiner's; a node that wants others would silently run
    // under rules it did not ask for.
    std::string mismatch;
    if (job.min_nodes != min_nodes || job.max_nodes != max_nodes)
      mismatch = "--nnodes: the job runs with " + std::to_string(job.min_nodes) + ":" + std::to_string(job.max_nodes) +
                 " nodes, this agent asked for " + std::to_string(min_nodes) + ":" + std::to_string(max_nodes);
    else if (job.max_restarts != m.max_restarts)
      mismatch = "--max_restarts: the job runs with " + std::to_string(job.max_restarts) + ", this agent asked for " +
                 std::to_string(m.max_restarts);
    else if (job.fixed_store_port != m.fixed_store_port)
      mismatch = std::string("--rdzv_backend: the job runs ") + (job.fixed_store_port ? "static" : "c10d") +
                 ", this agent asked for " + (m.fixed_store_port ? "static" : "c10d");
    if (!mismatch.empty()) {
      out.push_back(
          {conn, error_msg(mismatch + " (job " + run_id + "; every node must be started with the same job-wide flags)"),
           true});
      return;
    }
  }
  if (job.phase == Phase::Finished) {
    out.push_back({conn, error_msg("job " + run_id + " has already finished; use a new --rdzv_id"), true});
    return;
  }
  const int64_t fixed = m.node_rank;
  if (fixed >= max_nodes) {
    out.push_back({conn,
                   error_msg("--node_rank " + std::to_string(fixed) + " is out of range for " +
                             std::to_string(max_nodes) + " nodes (0.." + std::to_string(max_nodes - 1) + ")"),
                   true});
    if (created) jobs_.erase(it);
    return;
  }
  if (auto h = fixed >= 0 ? job.rank_holder.find(fixed) : job.rank_holder.end();
      h != job.rank_holder.end() && h->second != conn) {
    if (auto n = job.members.find(h->second); n != job.members.end() && n->second.fixed_rank == fixed) {
      out.push_back({conn,
                     error_msg("--node_rank " + std::to_string(fixed) + " is already taken by " + describe(n->second)),
                     true});
      return;
    }
  }
  {
    // The world size of any round these members can form stays an int, far from overflow.
    const auto self = job.members.find(conn);
    const int64_t total =
        job.member_workers - (self == job.members.end() ? 0 : self->second.local_world_size) + m.local_world_size;
    if (total > kMaxWorldSize) {
      out.push_back({conn,
                     error_msg("JOIN refused: job " + run_id + " would have " + std::to_string(total) +
                               " workers, more than " + std::to_string(kMaxWorldSize)),
                     true});
      if (created) jobs_.erase(it);
      return;
    }
  }
  if (m.resume_round >= 0 && (created || job.phase == Phase::Resuming)) {
    on_resume(job, conn, m, created, now, out);
    return;
  }
  Node& node = add_member(job, conn, m.local_world_size);
  const bool new_member = node.conn == 0;
  node.conn = conn;
  node.node_id = m.node_id;
  node.host = m.host;
  node.fixed_rank = fixed;
  if (fixed >= 0) job.rank_holder[fixed] = conn;
  node.prefer_rank0 = m.prefer_rank0;
  node.store_offer = m.store_offer_port;
  node.seen_from = m.seen_from;
  node.last_seen = now;
  if (new_member) node.seq = job.seq++;
  conn_job_[conn] = run_id;
  job.waiting.insert(conn);

  if (job.phase == Phase::Running && !job.in_round.count(conn)) {
    if (static_cast<int64_t>(job.participants.size()) < job.max_nodes) {
      restart(job, describe(node) + " joined: scale-up to a new round", /*spends_budget=*/false, now, out);
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
    // While the job gathers, a participant back (waiting) or gone stays so: the scan resumes
    // where it stopped, one pass over the participants per round.
    while (job.survivors_back < job.participants.size()) {
      const ConnId c = job.participants[job.survivors_back];
      if (job.members.count(c) && !job.waiting.count(c)) break;
      ++job.survivors_back;
    }
    complete = job.survivors_back == job.participants.size();
  }
  if (!complete && n >= job.min_nodes) {
    if (!job.last_call_deadline) job.last_call_deadline = now + job.last_call;
    complete = now >= *job.last_call_deadline;
  }
  if (complete) complete_round(job, out);
}

namespace {
// Addresses seen once each: open addressing over one array sized up front (under the state
// lock at every round; a hash set's node per address was most of the time at 16,000 nodes).
class SeenAddresses {
 public:
  explicit SeenAddresses(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.resize(cap);
  }
  // True the first time `a` is offered. At most n addresses are offered.
  bool insert(std::string_view a) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = std::hash<std::string_view>{}(a)&mask;; i = (i + 1) & mask) {
      if (slots_[i].data() == nullptr) {
        slots_[i] = a;
        return true;
      }
      if (slots_[i] == a) return false;
    }
  }

 private:
  std::vector<std::string_view> slots_;
};

// Every address node rank 0's store admits (ROUND's store_peers): each node's, as seen by this
// server and as it claims, once each, the list written in place.
template <class Nodes>
std::string store_peers_of(const Nodes& nodes) {
  std::string peers;
  size_t bytes = 0;
  for (const auto* n : nodes) bytes += n->seen_from.size() + n->host.size() + 2;
  peers.reserve(bytes);
  SeenAddresses seen(2 * nodes.size());
  auto add = [&](const std::string& a) {
    // A comma would split one claimed address into several.
    if (a.empty() || a.find(',') != std::string::npos || !seen.insert(a)) return;
    if (!peers.empty()) peers += ',';
    peers += a;
  };
  for (const auto* n : nodes) {
    add(n->seen_from);
    if (n->host != n->seen_from) add(n->host);
  }
  return peers;
}
}  // namespace

void RoundState::complete_round(Job& job, std::vector<Outbound>& out) {
  // Sorted by a key copied out of each node: fixed ranks first, in order; then the endpoint
  // host; then previous ranks; then arrival (no pointer chased per comparison).
  using Key = std::tuple<bool, int64_t, bool, int64_t, uint64_t>;
  std::vector<std::pair<Key, Node*>> keyed;
  keyed.reserve(job.waiting.size());
  // Both ordered by connection: one walk over the members, not a lookup per node.
  auto member = job.members.begin();
  for (ConnId c : job.waiting) {
    while (member != job.members.end() && member->first < c) ++member;
    if (member == job.members.end() || member->first != c) throw std::logic_error("a waiting node is no member");
    Node* n = &member->second;
    keyed.emplace_back(Key{n->fixed_rank < 0, n->fixed_rank, !n->prefer_rank0,
                           n->last_rank < 0 ? INT64_MAX : n->last_rank, n->seq},
                       n);
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Node*> nodes;
  nodes.reserve(keyed.size());
  for (const auto& k : keyed) nodes.push_back(k.second);
  if (static_cast<int64_t>(nodes.size()) > job.max_nodes) nodes.resize(job.max_nodes);

  if (job.round >= 0) close_store(job);
  ++job.round;
  std::vector<ConnId> conns;
  conns.reserve(nodes.size());
  job.world_size = 0;
  const bool everyone = nodes.size() == job.waiting.size();
  for (Node* n : nodes) {
    conns.push_back(n->conn);
    if (!everyone) job.waiting.erase(n->conn);
    job.world_size += n->local_world_size;
  }
  if (everyone) job.waiting.clear();
  set_participants(job, std::move(conns));
  // Node rank 0's own store when every node offered one (then every node reads store_host):
  // the workers' store outlives a restart of this server. ROUND tells node rank 0 every node's
  // addresses (store_peers): a round whose addresses do not fit keeps its store on the server
  // (some 49,000 nodes of one IPv4 address each fit; 8,192 of two IPv6 addresses at worst).
  const bool offered = !job.fixed_store_port &&
                       std::all_of(nodes.begin(), nodes.end(), [](const Node* n) { return n->store_offer > 0; });
  std::string store_peers = offered ? store_peers_of(nodes) : std::string();
  job.agent_store = offered && store_peers.size() <= kMaxStorePeersLen;
  job.agent_progress = false;
  job.deferred_failure.reset();
  uint16_t port = 0;
  std::string store_host;
  if (job.agent_store) {
    port = static_cast<uint16_t>(nodes.front()->store_offer);
    store_host = nodes.front()->host;
  } else {
    store_peers.clear();
    port = stores_.open(job.run_id, job.round, job.fixed_store_port);
  }
  // What every node's ROUND says; node rank 0's names the store's peers too.
  const Round common{.run_id = job.run_id,
                     .round = job.round,
                     .restart_count = job.restart_count,
                     .max_restarts = job.max_restarts,
                     .nnodes = static_cast<int64_t>(nodes.size()),
                     .world_size = job.world_size,
                     .store_port = port,
                     .store_host = store_host};
  std::shared_ptr<const Round> shared_common, shared_first;
  if (deferred_rounds_) {
    shared_common = std::make_shared<const Round>(common);
    Round first = common;
    first.store_peers = store_peers;
    shared_first = std::make_shared<const Round>(std::move(first));
  }
  int64_t base = 0;
  out.reserve(out.size() + nodes.size());
  for (size_t r = 0; r < nodes.size(); ++r) {
    Node* n = nodes[r];
    const auto rank = static_cast<int64_t>(r);
    n->last_rank = rank;
    if (deferred_rounds_) {
      out.push_back({n->conn, Message{MsgType::Round, {}}, false, r == 0 ? shared_first : shared_common, rank, base});
    } else {
      Round m = common;
      m.node_rank = rank;
      m.base_rank = base;
      if (r == 0) m.store_peers = store_peers;
      out.push_back({n->conn, to_message(m)});
    }
    base += n->local_world_size;
  }
  job.phase = Phase::Running;
  job.succeeded.clear();
  job.last_call_deadline.reset();
  job.join_deadline.reset();
  ++rounds_completed_;
}

void RoundState::restart(Job& job, const std::string& reason, bool spends_budget, Clock::time_point now,
                         std::vector<Outbound>& out) {
  if (spends_budget) ++job.restart_count;
  broadcast(
      job.participants, to_message(Restart{.reason = reason, .restart_count = job.restart_count, .round = job.round}),
      [&](ConnId c) { return job.members.count(c) > 0; }, out);
  job.phase = Phase::Gathering;
  job.survivors_back = 0;
  job.last_call_deadline.reset();
  job.join_deadline = now + job.join_timeout;
  maybe_complete(job, now, out);
}

void RoundState::fail_job(Job& job, const std::string& reason, FailCause cause, std::vector<Outbound>& out) {
  broadcast(
      job.members,
      to_message(JobFailed{.reason = reason,
                           .cause = static_cast<int64_t>(cause),
                           .restart_count = job.restart_count,
                           .max_restarts = job.max_restarts,
                           .first_failure = job.first_failure}),
      [](ConnId) { return true; }, out);
  job.phase = Phase::Finished;
  if (job.round >= 0) close_store(job);
}

void RoundState::close_store(const Job& job) {
  if (!job.agent_store) stores_.close(job.run_id, job.round);
}

bool RoundState::progressed(const Job& job) {
  return job.agent_store ? job.agent_progress : stores_.progressed(job.run_id, job.round, job.world_size);
}

bool RoundState::is_participant(const Job& job, ConnId conn) const { return job.in_round.count(conn) > 0; }

void RoundState::set_participants(Job& job, std::vector<ConnId> conns) {
  job.participants = std::move(conns);
  job.in_round.assign(job.participants);
  job.survivors_back = 0;
}

void RoundState::add_participant(Job& job, ConnId conn) {
  job.participants.push_back(conn);
  job.in_round.insert(conn);
  job.survivors_back = 0;
}

RoundState::Node& RoundState::add_member(Job& job, ConnId conn, int64_t local_world_size) {
  Node& n = job.members[conn];
  job.member_workers += local_world_size - (n.conn == 0 ? 0 : n.local_world_size);
  n.local_world_size = local_world_size;
  return n;
}

// The snapshots travel as the agents wrote them (the launcher reads them; the server only
// bounds their size), by node rank (the last round's; joiners after them), as one JSON array
// within one frame.
void RoundState::on_status_query(ConnId conn, const StatusQuery& m, std::vector<Outbound>& out) const {
  StatusReply reply;
  auto it = jobs_.find(m.run_id);
  if (it != jobs_.end()) {
    const Job& job = it->second;
    reply.found = true;
    reply.members = static_cast<int64_t>(job.members.size());
    std::vector<const Node*> nodes;
    for (const auto& [c, node] : job.members) nodes.push_back(&node);
    std::stable_sort(nodes.begin(), nodes.end(), [](const Node* a, const Node* b) {
      return (a->last_rank < 0 ? INT64_MAX : a->last_rank) < (b->last_rank < 0 ? INT64_MAX : b->last_rank);
    });
    constexpr size_t kMaxReplyBytes = kMaxFrameBytes - 4096;
    reply.agents = "[";
    for (const Node* n : nodes) {
      if (n->status.empty() || reply.agents.size() + n->status.size() + 2 > kMaxReplyBytes) continue;
      reply.agents += (reply.agents.size() > 1 ? "," : "") + n->status;
    }
    reply.agents += "]";
  }
  out.push_back({conn, to_message(reply)});
}

void RoundState::on_progress(Job& job, ConnId conn, const Progress& m) {
  // Only the store's host knows; anyone else saying so is ignored.
  if (!job.agent_store || m.round != job.round || job.members.at(conn).last_rank != 0 || !is_participant(job, conn))
    return;
  if (job.phase == Phase::Running || job.phase == Phase::Resuming) job.agent_progress = true;
}

namespace {
// The last non-empty line of a stderr tail ("" when none).
std::string_view last_line(std::string_view tail) {
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.remove_suffix(1);
  const auto nl = tail.rfind('\n');
  return nl == std::string_view::npos ? tail : tail.substr(nl + 1);
}
// Two failures said the same last thing: every rank of an import error fails alike, and which
// one is reported first is a race.
bool same_last_line(const std::string& a, const std::string& b) {
  return !last_line(a).empty() && last_line(a) == last_line(b);
}
// For a failure that ends the job with restarts left: why the budget is not used up (a reader
// sees restarts left and no restart).
std::string restarts_left_unused(int64_t restart_count, int64_t max_restarts) {
  const int64_t left = max_restarts - restart_count;
  return left > 0 ? " although " + std::to_string(left) + " of " + std::to_string(max_restarts) +
                        " restarts are left (--retry_deterministic retries it)"
                  : std::string();
}
}  // namespace

void RoundState::on_failure(Job& job, ConnId conn, const Failure& m, std::vector<Outbound>& out) {
  if (m.round != job.round || !is_participant(job, conn)) return;  // stale
  if (job.phase == Phase::Resuming) {
    if (!job.deferred_failure) job.deferred_failure.emplace(conn, m);
    return;
  }
  if (job.phase != Phase::Running) return;
  const Node& node = job.members.at(conn);
  if (!job.first_failure) {
    job.first_failure = m;
    job.first_failure->node_rank = node.last_rank;
    job.first_failure->node_id = node.node_id;
    job.first_failure->host = node.host;
  }
  std::string what = "rank " + std::to_string(m.global_rank) + " on " + describe(node) + " failed";
  if (!m.signal.empty()) what += " (signal " + m.signal + ")";
  else what += " (exit code " + std::to_string(m.exit_code) + ")";
  // A worker that said a restart cannot fix its failure (a ConfigError) is believed.
  if (m.config_error && !job.retry_deterministic) {
    fail_job(job,
             what +
                 " with a configuration error that a restart cannot fix (ConfigError in its error file), "
                 "not retried" +
                 restarts_left_unused(job.restart_count, job.max_restarts),
             FailCause::ConfigError, out);
    return;
  }
  // A deterministic failure (an import error, a bad path) repeats: the same rank, the same
  // way, within seconds, before every worker joined the store. Only that is not retried.
  const bool quick = !this->progressed(job) && m.runtime_ms <= kQuickFailure.count();  // -1: an older agent
  const auto& prev = job.previous_quick_failure;
  if (quick && prev && !job.retry_deterministic && prev->exit_code == m.exit_code && prev->signal == m.signal &&
      (prev->global_rank == m.global_rank || same_last_line(prev->stderr_tail, m.stderr_tail))) {
    std::string took = m.runtime_ms >= 0 ? " after " + std::to_string(m.runtime_ms) + " ms" : std::string();
    fail_job(job,
             what + took +
                 ", before every worker had joined the store, as it did in the attempt before: a "
                 "deterministic failure (an import error or a bad path?), not retried" +
                 restarts_left_unused(job.restart_count, job.max_restarts),
             FailCause::Deterministic, out);
    return;
  }
  job.previous_quick_failure = quick ? std::optional<Failure>(m) : std::nullopt;
  if (job.restart_count >= job.max_restarts) {
    fail_job(job, what + "; the restart budget (max_restarts=" + std::to_string(job.max_restarts) + ") is spent",
             FailCause::BudgetSpent, out);
    return;
  }
  restart(job, what, /*spends_budget=*/true, job.members.at(conn).last_seen, out);
}

void RoundState::on_succeeded(Job& job, ConnId conn, const Succeeded& m, std::vector<Outbound>& out) {
  if (m.round != job.round || !is_participant(job, conn)) return;
  if (job.phase == Phase::Resuming) {
    job.succeeded.insert(conn);  // counted once the round is whole again
    return;
  }
  if (job.phase != Phase::Running) return;
  job.succeeded.insert(conn);
  maybe_done(job, out);
}

void RoundState::maybe_done(Job& job, std::vector<Outbound>& out) {
  if (job.succeeded.size() < job.participants.size()) return;  // not all yet: no walk per SUCCEEDED
  for (ConnId c : job.participants)
    if (!job.succeeded.count(c)) return;
  broadcast(
      job.members, to_message(JobDone{.round = job.round, .restart_count = job.restart_count}),
      [](ConnId) { return true; }, out);
  job.phase = Phase::Finished;
  close_store(job);
}

void RoundState::node_lost(Job& job, ConnId conn, const std::string& why, Clock::time_point now,
                           std::vector<Outbound>& out) {
  const Node node = job.members.at(conn);
  const bool was_participant = job.in_round.count(conn) > 0;
  job.member_workers -= node.local_world_size;
  job.members.erase(conn);
  job.waiting.erase(conn);
  if (job.phase == Phase::Finished) return;
  if (job.phase == Phase::Resuming) {
    // Not back after all: the round waits for the others until join_timeout.
    std::erase(job.participants, conn);
    job.in_round.erase(conn);
    job.survivors_back = 0;
    job.succeeded.erase(conn);
    return;
  }
  if (job.phase == Phase::Gathering) {
    if (job.round >= 0 && was_participant && static_cast<int64_t>(job.members.size()) < job.min_nodes) {
      fail_job(job,
               "lost " + describe(node) + " (" + why + "): " + std::to_string(job.members.size()) +
                   " nodes remain, fewer than the minimum of " + std::to_string(job.min_nodes),
               FailCause::LostNodes, out);
      return;
    }
    if (static_cast<int64_t>(job.waiting.size()) < job.min_nodes) job.last_call_deadline.reset();
    maybe_complete(job, now, out);
    return;
  }
  if (!was_participant) return;  // a spare went away
  const auto remaining = static_cast<int64_t>(job.members.size());
  if (remaining < job.min_nodes) {
    fail_job(job,
             "lost " + describe(node) + " (" + why + "): " + std::to_string(remaining) +
                 " nodes remain, fewer than the minimum of " + std::to_string(job.min_nodes),
             FailCause::LostNodes, out);
    return;
  }
  if (job.restart_count >= job.max_restarts) {
    fail_job(job,
             "lost " + describe(node) + " (" + why +
                 "); the restart budget (max_restarts=" + std::to_string(job.max_restarts) + ") is spent",
             FailCause::BudgetSpent, out);
    return;
  }
  restart(job, "lost " + describe(node) + " (" + why + ")", /*spends_budget=*/true, now, out);
}

void RoundState::on_disconnect(ConnId conn, Clock::time_point now, std::vector<Outbound>& out) {
  dropped_.erase(conn);
  auto cj = conn_job_.find(conn);
  if (cj == conn_job_.end()) return;
  auto jit = jobs_.find(cj->second);
  conn_job_.erase(cj);
  Job& job = jit->second;
  if (job.members.count(conn)) node_lost(job, conn, "connection closed", now, out);
  if (job.members.empty()) {
    if (job.phase != Phase::Finished && job.round >= 0) close_store(job);
    jobs_.erase(jit);
  }
}

const std::vector<ConnId>& RoundState::participants(const std::string& run_id) const {
  static const std::vector<ConnId> none;
  auto it = jobs_.find(run_id);
  return it == jobs_.end() ? none : it->second.participants;
}

bool RoundState::in_round(const std::string& run_id, ConnId conn) const {
  auto it = jobs_.find(run_id);
  return it != jobs_.end() && it->second.in_round.count(conn) > 0;
}

bool RoundState::is_participant(ConnId conn) const {
  auto cj = conn_job_.find(conn);
  if (cj == conn_job_.end()) return false;
  auto it = jobs_.find(cj->second);
  return it != jobs_.end() && it->second.in_round.count(conn) > 0;
}

}  // namespace ddprun::rdzv
