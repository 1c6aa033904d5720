// Rendezvous rounds, run by the server: agents send one JOIN per round and get back one
// ROUND (node rank, world layout, restart count, the workers' store port). Pure: no sockets,
// no clock of its own (callers pass `now`), so every timing rule is unit-tested.
//
// Rules (docs/RENDEZVOUS.md):
//  - a round completes when MAX nodes joined; or, after a restart, as soon as every surviving
//    node of the previous round is back (and >= MIN); or last_call after MIN joined;
//  - join_timeout bounds the wait: the waiting agents get ERROR naming how many came;
//  - one restart budget for the whole job; a failure report or a lost node spends one; a
//    node arriving while the job runs (below MAX) triggers a new round without spending one;
//  - a failure that repeats before any progress in two attempts in a row ends the job;
//  - job-wide settings (nnodes, max_restarts, the store port mode) are the first joiner's; a
//    node that asks for other values is refused, the error naming both;
//  - node ranks are stable across rounds; a node with prefer_rank0 (the endpoint host) gets 0;
//  - a node is lost when its connection closes or its heartbeats stop (heartbeat_timeout_ms).
//  - Resume: a standing server that restarted knows no job. Agents whose workers run reconnect
//    and re-join with the round they run (Join::resume_*); the first such JOIN re-creates the
//    job in that round with its restart count, and once every node of the round is back (its
//    node ranks 0..nnodes-1) the round runs again: no ROUND is sent, the workers keep
//    running, no restart is spent, the workers' store is reopened on its old port when free.
//    Nodes that had succeeded count as succeeded; a FAILURE or SUCCEEDED of the round that
//    arrives before the round is whole again is applied once it is. If the round is not whole
//    by join_timeout, the nodes that came back restart without spending budget (at least
//    MIN), or the job fails.
//  - Agent-hosted stores: when every node of a round offered a store of its own
//    (Join::store_offer_port; not with fixed_store_port, nor when their addresses outgrow
//    kMaxStorePeersLen),
//    node rank 0's hosts the round's workers' store: ROUND names its address and port, and
//    tells node rank 0 whom to admit. The server opens no store for that round; its progress
//    is what node rank 0 reports (PROGRESS), and a restart of the server leaves it untouched.
//
// These rules live here only: the launcher runs this same class in-process for a single node
// (launcher/coordinator.h, LocalCoordinator), so one node and many follow one policy.
//
// Thread-safety: none; the server calls it under its state lock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "ddprun/rdzv/agent_protocol.h"

namespace ddprun::rdzv {

using ConnId = uint64_t;
using Clock = std::chrono::steady_clock;

struct Outbound {
  ConnId conn;
  Message msg;
  bool close_after = false;  // close the connection once the message is written
  // RoundState::set_deferred_rounds: a ROUND still to be made into `msg` (Outbound::message),
  // so that a server makes thousands of them after its lock, not under it: the round's fields,
  // one copy shared by its agents (node rank 0's own, with store_peers), and this agent's.
  std::shared_ptr<const Round> round = nullptr;
  int64_t node_rank = 0, base_rank = 0;
  // Likewise a message to every agent of a job (RESTART, JOB_FAILED, JOB_DONE): one copy shared
  // by all, each agent's own (which its seal changes) made by Outbound::message.
  std::shared_ptr<const Message> shared = nullptr;
  // `msg`, made from `round` or `shared` first where that is set.
  Message& message() {
    if (round) {
      Round r = *round;
      r.node_rank = node_rank;
      r.base_rank = base_rank;
      msg = to_message(r);
      round.reset();
    } else if (shared) {
      msg = *shared;
      shared.reset();
    }
    return msg;
  }
};

// Where the workers of a round keep their keys: a fresh, empty store per round.
class WorkerStores {
 public:
  virtual ~WorkerStores() = default;
  // Opens the store of (run_id, round), empty, and returns its TCP port. `fixed_port`: the
  // store is the server's main keyspace, emptied (its TCPStore connections closed), on the
  // server's own port, so every round has the same port (Join::fixed_store_port).
  virtual uint16_t open(const std::string& run_id, int64_t round, bool fixed_port) = 0;
  virtual void close(const std::string& run_id, int64_t round) = 0;
  // Whether the round's workers made progress: all `world_size` of them joined the store
  // (PyTorch and libddprun_worker clients add 1 to `init/` when they connect).
  virtual bool progressed(const std::string& run_id, int64_t round, int64_t world_size) = 0;
  // As open(), on `port` when it can (a round rebuilt after a server restart: its workers
  // were told that port); any free port otherwise.
  virtual uint16_t reopen(const std::string& run_id, int64_t round, bool fixed_port, uint16_t port) {
    (void)port;
    return open(run_id, round, fixed_port);
  }
  // A round was rebuilt from its agents' re-joins (Resume) and runs on; `agent_hosted`: its
  // workers' store is node rank 0's, so nothing was reopened. For the server's log.
  virtual void resumed(const std::string& run_id, int64_t round, bool agent_hosted) {
    (void)run_id, (void)round, (void)agent_hosted;
  }
};

class RoundState {
 public:
  explicit RoundState(WorkerStores& stores) : stores_(stores) {}

  void on_message(ConnId conn, const Message& m, Clock::time_point now, std::vector<Outbound>& out) {
    on_inbound(conn, decode(m), now, out);
  }
  // A message in its typed form, decoded apart from the state: a server decodes before it takes
  // its lock (a JOIN's fields, a FAILURE's text), so 16,000 agents' JOINs are decoded in
  // parallel and only applied one at a time.
  struct Inbound {
    MsgType type = MsgType::Heartbeat;
    std::variant<std::monostate, Join, StatusQuery, Heartbeat, Failure, Succeeded, Progress> body;
  };
  static Inbound decode(const Message& m);
  void on_inbound(ConnId conn, Inbound m, Clock::time_point now, std::vector<Outbound>& out);
  void on_disconnect(ConnId conn, Clock::time_point now, std::vector<Outbound>& out);
  // Heartbeats and deadlines are judged against the caller's own progress, here and only here.
  // The caller promises a tick at least every `period` (set_tick_period) while any job exists;
  // a gap between two ticks longer than that plus kStallSlack means the caller itself made no
  // progress meanwhile (a stall: a request that held it, the host, a SIGSTOP), and that time,
  // S = gap - period, is not counted: every member's last heartbeat and every job's join and
  // last-call deadline move S later, before anyone is judged. So what the agents sent during
  // the stall may be read before or after this tick: the outcome is the same. Without a
  // period, a gap over half a job's heartbeat timeout is a stall (S = gap) for that job.
  void on_tick(Clock::time_point now, std::vector<Outbound>& out);
  void set_tick_period(Clock::duration period) { tick_period_ = period; }
  // A round's ROUND messages come out as Outbound::round, and a message to every agent of a job
  // as Outbound::shared, to be made by Outbound::message().
  void set_deferred_rounds(bool on) { deferred_rounds_ = on; }
  static constexpr Clock::duration kStallSlack = std::chrono::milliseconds(100);
  // A failure this quick (the worker's runtime), before every worker joined the store, and
  // the same as the attempt before's (rank, exit code or signal) is deterministic: not retried
  // unless the job asked for it (Join::retry_deterministic).
  static constexpr std::chrono::milliseconds kQuickFailure{2000};
  // The gap the last tick found, when it was such a stall (else zero): for the server's log.
  Clock::duration last_stall() const { return last_stall_; }
  // The earliest last-call or join deadline, if any. Heartbeat expiry is not included: the
  // caller ticks periodically (a fraction of the heartbeat timeout) for that.
  std::optional<Clock::time_point> next_deadline() const;

  // The connections of the agents in the job's current (or last) round; none for an unknown job.
  const std::vector<ConnId>& participants(const std::string& run_id) const;
  // Whether `conn` is an agent in its job's current (or last) round.
  bool is_participant(ConnId conn) const;
  // Whether `conn` is among participants(run_id).
  bool in_round(const std::string& run_id, ConnId conn) const;

  size_t num_jobs() const { return jobs_.size(); }
  // Rounds completed so far, every job's (the server names what held its lock by it).
  uint64_t rounds_completed() const { return rounds_completed_; }
  size_t num_agents() const { return conn_job_.size(); }

 private:
  struct Node {
    ConnId conn = 0;
    std::string node_id, host;
    int64_t local_world_size = 1;
    int64_t fixed_rank = -1;
    bool prefer_rank0 = false;
    int64_t store_offer = 0;  // Join::store_offer_port
    std::string seen_from;    // Join::seen_from
    int64_t last_rank = -1;
    uint64_t seq = 0;
    Clock::time_point last_seen;
    std::string status;  // its last status snapshot (Heartbeat::status), for STATUS_QUERY
  };
  enum class Phase { Gathering, Running, Finished, Resuming };
  // A set of connections as one sorted array: made from a round's participants at its
  // completion, under the state lock, with one allocation and a sort of integers (a hash set
  // allocated a node per agent: about 1 ms at 16,000 agents); a lookup is a binary search.
  class ConnSet {
   public:
    void assign(const std::vector<ConnId>& conns) {
      v_.assign(conns.begin(), conns.end());
      std::sort(v_.begin(), v_.end());
    }
    size_t count(ConnId c) const { return std::binary_search(v_.begin(), v_.end(), c) ? 1 : 0; }
    void insert(ConnId c) {
      auto it = std::lower_bound(v_.begin(), v_.end(), c);
      if (it == v_.end() || *it != c) v_.insert(it, c);
    }
    void erase(ConnId c) {
      auto it = std::lower_bound(v_.begin(), v_.end(), c);
      if (it != v_.end() && *it == c) v_.erase(it);
    }

   private:
    std::vector<ConnId> v_;
  };
  struct Job {
    std::string run_id;
    int64_t min_nodes = 1, max_nodes = 1, max_restarts = 0;
    bool fixed_store_port = false;
    std::chrono::milliseconds last_call{30000}, join_timeout{600000}, heartbeat_timeout{5000};
    Phase phase = Phase::Gathering;
    int64_t round = -1;  // last completed round
    int64_t restart_count = 0;
    int64_t world_size = 0;
    std::map<ConnId, Node> members;
    std::vector<ConnId> participants;  // of the current round, by node rank
    std::set<ConnId> waiting;          // joined for the next round
    std::set<ConnId> succeeded;
    std::optional<Clock::time_point> last_call_deadline, join_deadline;
    std::optional<Failure> first_failure;
    // The previous attempt's failure when it looked deterministic (quick, before every worker
    // joined the store): the next one repeating it ends the job (on_failure).
    std::optional<Failure> previous_quick_failure;
    bool retry_deterministic = false;
    uint64_t seq = 0;
    // Resuming: the round's size and store port as the agents know them.
    int64_t resume_nnodes = 0;
    int64_t resume_store_port = 0;
    std::string resume_store_host;
    // A FAILURE of the round being rebuilt, applied once it is whole (the first one only).
    std::optional<std::pair<ConnId, Failure>> deferred_failure;
    // The current round's workers' store is node rank 0's (agent-hosted), and whether node
    // rank 0 reported that every worker joined it.
    bool agent_store = false;
    bool agent_progress = false;
    // Kept beside members and participants so that no message walks the whole job: a round
    // of N agents costs O(N log N), not O(N^2).
    int64_t member_workers = 0;                        // the members' local_world_size, summed
    std::unordered_map<int64_t, ConnId> rank_holder;   // --node_rank -> its member (checked on read)
    std::unordered_map<int64_t, ConnId> resumed_rank;  // resumed node rank -> its member (checked on read)
    ConnSet in_round;                                  // the participants, as a set
    size_t survivors_back = 0;                         // maybe_complete: participants[0, this) are back or gone
  };

  void on_join(ConnId conn, const Join& m, Clock::time_point now, std::vector<Outbound>& out);
  void on_resume(Job& job, ConnId conn, const Join& m, bool created, Clock::time_point now, std::vector<Outbound>& out);
  void resume_timed_out(Job& job, Clock::time_point now, std::vector<Outbound>& out);
  void maybe_done(Job& job, std::vector<Outbound>& out);
  void on_failure(Job& job, ConnId conn, const Failure& m, std::vector<Outbound>& out);
  void on_succeeded(Job& job, ConnId conn, const Succeeded& m, std::vector<Outbound>& out);
  void on_status_query(ConnId conn, const StatusQuery& m, std::vector<Outbound>& out) const;
  void on_progress(Job& job, ConnId conn, const Progress& m);
  bool progressed(const Job& job);
  void close_store(const Job& job);
  bool is_participant(const Job& job, ConnId conn) const;
  // Every change of job.participants goes through these two (in_round follows it).
  static void set_participants(Job& job, std::vector<ConnId> conns);
  static void add_participant(Job& job, ConnId conn);
  // A node enters or leaves job.members (member_workers follows it).
  static Node& add_member(Job& job, ConnId conn, int64_t local_world_size);
  void node_lost(Job& job, ConnId conn, const std::string& why, Clock::time_point now, std::vector<Outbound>& out);
  void maybe_complete(Job& job, Clock::time_point now, std::vector<Outbound>& out);
  void complete_round(Job& job, std::vector<Outbound>& out);
  void restart(Job& job, const std::string& reason, bool spends_budget, Clock::time_point now,
               std::vector<Outbound>& out);
  void fail_job(Job& job, const std::string& reason, FailCause cause, std::vector<Outbound>& out);
  // A node as users read it: "node 2 (host gpu-7, 10.0.0.7)", its node rank in its last round
  // ("a node" before one) and its host, never the agent's internal id.
  static std::string describe(const Node& n);

 public:
  // The host name in an agent's id ("<hostname>_<host>_<pid>" gives hostname); the id itself
  // when it has another form.
  static std::string host_name_of(const std::string& node_id, const std::string& host);

 private:
  // `m` to each of `conns` (ConnIds, or map entries keyed by them) that `to` accepts.
  template <class Conns, class To>
  void broadcast(const Conns& conns, Message m, To to, std::vector<Outbound>& out) const;

  WorkerStores& stores_;
  std::map<std::string, Job> jobs_;
  std::map<ConnId, std::string> conn_job_;
  // Dropped for missed heartbeats, their connections not closed yet: what they still send (the
  // heartbeats queued behind the drop) is ignored, so the drop's ERROR is their one answer.
  std::set<ConnId> dropped_;
  // The stall of the caller between two ticks, not counted against job (zero: none).
  Clock::duration stall_for(const Job& job, Clock::duration gap) const;

  std::optional<Clock::time_point> last_tick_;  // unset while no job exists
  std::optional<Clock::duration> tick_period_;
  bool deferred_rounds_ = false;
  uint64_t rounds_completed_ = 0;
  Clock::duration last_stall_{};
};

}  // namespace ddprun::rdzv
