// The scale simulator's actors: N agents speaking the agent protocol to a rendezvous server
// (token handshake, MACs, heartbeats, JOIN, ROUND), and for each ROUND the node's P workers
// doing what PyTorch 2.x does with the workers' store the round names:
//   1. TCPStore(..., world_size, is_master=False): connect, VALIDATE + PING, ADD "init/" 1
//      (every client counts itself; the server side reads it as "every worker joined");
//   2. the store-based barrier of init_process_group (TORCH_DIST_INIT_BARRIER=1): ADD k 1,
//      ADD k 0, the rank that sees world_size SETs k:last_worker, every rank WAITs for it;
//   3. ProcessGroupNCCL's unique-id broadcast: rank 0 SETs the 128-byte id, the others WAIT
//      and GET it (PrefixStore keys "default_pg/0//cuda//0");
//   4. optionally (--gloo) Gloo's connectFullMesh: every rank SETs its pair addresses, one
//      per peer, under its rank, then WAITs and GETs every other rank's (O(world^2) reads by
//      design, so only for small worlds).
// Between its ROUND and its workers a real agent does no store work of its own: node rank 0's
// hosts the workers' store when the agents offered one (--offer-store: a separate server
// stands in for it) and reads its init/ counter in-process; the PROGRESS it then sends is not
// simulated. Counters and timestamps are shared by the loop threads (atomics).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/agent_protocol.h"
#include "ddprun/wire/codec.h"
#include "sim_net.h"

namespace ddprun::scale {

struct Options {
  std::string host = "127.0.0.1", run_id = "scale", token;
  uint16_t port = 29400;
  int agents = 64, nproc = 8, threads = 1;
  int heartbeat_ms = 1000;
  int store_offer_port = 0;  // every JOIN offers a workers' store on this port (node rank 0's hosts it)
  // --store-at: the workers go to this store instead of the one the ROUND names (another
  // server, PyTorch's own TCPStore say). Port 0: the ROUND's.
  std::string store_at_host;
  int store_at_port = 0;
  bool workers = true, gloo = false, source_ips = true;
  int min_nodes = 0;  // the JOINs' min_nodes (0: --agents; below it, a lost node ends the job)
  bool relay = false;        // each node's workers over one multiplexed connection (sim_relay.cpp)
  int part = 0, parts = 1;   // this process simulates the agents i with i % parts == part
  double timeout_s = 120;
  double churn_pct = 0;        // --churn: this % of the agents leave, as many new ones join
  bool expect_restart = false;  // --expect-restart: the daemon is killed and started again from outside
};

// One round as its agents and workers saw it (--churn: rounds follow each other while the
// agents come and go, so ranks and counts are kept per round).
struct RoundTally {
  int64_t agents = 0, done = 0, world = -1, restart_count = -1, dup_ranks = 0;
  int64_t t_last_round = 0, t_last_done = 0;
  std::vector<uint8_t> seen;  // per rank of this round
};

// What every thread adds to. Times are ns since the run's start (0: not yet).
struct Shared {
  explicit Shared(const Options& o);
  const Options& o;
  Clock::time_point start = Clock::now();
  std::atomic<bool> go_join{false}, stop{false};
  std::atomic<int64_t> handshaken{0}, rounds{0}, workers_joined{0}, barrier_passed{0}, workers_done{0}, errors{0};
  std::atomic<int64_t> t_first_join{0}, t_last_round{0}, t_last_joined{0}, t_last_barrier{0}, t_last_done{0};
  std::atomic<int64_t> world_size{-1};
  std::unique_ptr<std::atomic<uint8_t>[]> rank_seen;  // per global rank: how many workers had it
  int64_t rank_seen_n = 0;                             // its length (the current round's world)
  std::atomic<int64_t> duplicate_ranks{0};
  // --kill-one: the agent whose loop closes it (and its workers) without a LEAVE, as if its
  // node died; the survivors' RESTARTs counted, the time of the last one.
  std::atomic<int64_t> kill_index{-1}, restarts{0}, t_last_restart{0};
  // Store connections that close are expected (a node died or left; the round's store goes
  // before the RESTART arrives).
  std::atomic<bool> tolerate_store_loss{false};
  // --churn: the leavers go and the late agents start; rounds are tallied per round.
  std::atomic<bool> churn{false}, tally_rounds{false};
  std::vector<uint8_t> leavers;  // per agent index: 1 closes, 2 sends LEAVE and closes
  std::mutex tally_mu;
  std::map<int64_t, RoundTally> tally;
  void on_agent_round(int64_t index, const rdzv::Round& r);
  void on_worker_done(int64_t round, int64_t rank, int64_t world);
  // --expect-restart: the first lost connection, every agent re-joined (resume JOIN), every
  // agent's JOB_DONE (its round whole again); reconnect attempts.
  std::atomic<int64_t> t_first_loss{0}, lost{0}, rejoined{0}, t_last_rejoin{0}, jobs_done{0}, t_last_job_done{0},
      attempts{0}, rechecked{0}, t_last_recheck{0};
  std::atomic<bool> recheck{false};
  int64_t now_ns() const;
  void mark(std::atomic<int64_t>& t) const;  // t = max(t, now)
  void error(const std::string& what);
};

class Worker;
class RelayLink;

class Agent : public Endpoint {
 public:
  // `late`: one of --churn's new agents, started when the churn begins.
  Agent(Shared& s, int64_t index, bool late = false) : s_(s), index_(index), late_(late) {}
  void start(Loop& loop, const sockaddr_in& server);
  bool late() const { return late_; }
  // --churn: a new agent connects and JOINs once handshaken; a leaver goes (LEAVE or not).
  void start_late(Loop& loop, const sockaddr_in& server);
  void leave(Loop& loop, bool say_leave);
  // --expect-restart: a reconnect that is due.
  void tick(Loop& loop, Clock::time_point now);
  void recheck(Loop& loop);
  void send_join(Loop& loop, bool again = false);
  void heartbeat(Loop& loop);
  int64_t index() const { return index_; }
  // Its node dies: the agent's and its workers' connections close, nothing is said.
  void die(Loop& loop);
  void on_connected(Loop& loop) override;
  void on_readable(Loop& loop) override;
  void on_failed(Loop& loop, int err) override;
  bool handshaken() const { return handshaken_; }
  std::vector<std::unique_ptr<Worker>>& workers() { return workers_; }

 private:
  void on_message(Loop& loop, const rdzv::Message& m);
  void on_round(Loop& loop, const rdzv::Round& r);
  // What the launcher's agent does on RESTART: stop its workers, JOIN again.
  void on_restart(Loop& loop);
  void stop_workers(Loop& loop);
  void write(Loop& loop, rdzv::Message m);
  void on_handshaken(Loop& loop);
  rdzv::Join join_message() const;
  // The standing server went while this agent's round runs: reconnect with backoff (sim_restart.cpp).
  void lost(Loop& loop);
  void rejoin(Loop& loop);

  Shared& s_;
  int64_t index_;
  bool late_ = false;
  sockaddr_in server_{};
  std::optional<rdzv::ClientHandshake> hs_;
  std::optional<rdzv::SessionMac> mac_;
  bool handshaken_ = false, got_round_ = false, dead_ = false;
  bool join_on_handshake_ = false, resuming_ = false, finished_ = false;
  rdzv::Round last_round_;
  Clock::time_point reconnect_at_{};
  int backoff_ms_ = 50;
  bool reconnecting_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<RelayLink> relay_;
};

class Worker : public Endpoint {
 public:
  Worker(Shared& s, int64_t round, int64_t rank, int64_t world, uint32_t source)
      : s_(s), round_(round), rank_(rank), world_(world), source_(source) {}
  void start(Loop& loop, const sockaddr_in& store);
  // Through a node's relay instead of a socket of its own: the link connects and calls back.
  void via(RelayLink* link, uint32_t channel) { relay_ = link, channel_ = channel; }
  void on_connected(Loop& loop) override;
  void on_readable(Loop& loop) override;
  void on_failed(Loop& loop, int err) override;
  // --expect-restart, once the round is whole again: the same worker reads the NCCL id again
  // on the same store connection (it was not restarted and its store outlived the server).
  void recheck(Loop& loop);

 private:
  enum class Step { Ping, InitAdd, BarrierAdd, BarrierCount, BarrierWait, NcclWait, NcclGet, GlooWait, GlooGet, Done,
                    Recheck, Rechecked };
  void request(Loop& loop, const std::string& bytes, Step next);
  void send(Loop& loop, const std::string& bytes);
  bool live() const;
  void on_reply(Loop& loop, const uint8_t* p, size_t n);
  void nccl(Loop& loop);
  void gloo_next(Loop& loop);
  void finish();

  Shared& s_;
  int64_t round_, rank_, world_;
  uint32_t source_;
  Step step_ = Step::Ping;
  int64_t gloo_peer_ = 0;
  RelayLink* relay_ = nullptr;
  uint32_t channel_ = 0;
};

// One node's relay: its workers are channels 1..P of one connection to the store.
class RelayLink : public Endpoint {
 public:
  RelayLink(Shared& s, int64_t node) : s_(s), node_(node) {}
  void add(Worker& w) {
    workers_.push_back(&w);
    w.via(this, channel_of(workers_.size() - 1));
  }
  void start(Loop& loop, const sockaddr_in& store, uint32_t source);
  void send(Loop& loop, uint32_t channel, const std::string& bytes);
  void on_connected(Loop& loop) override;
  void on_readable(Loop& loop) override;
  void on_failed(Loop& loop, int err) override;

 private:
  static uint32_t channel_of(size_t i) { return static_cast<uint32_t>(i + 1); }
  Shared& s_;
  int64_t node_;
  std::vector<Worker*> workers_;
};

// Bytes of one encoded TCPStore request (dialect D2, PyTorch 2.x).
std::string store_request(wire::Op op, std::vector<std::string> keys, std::vector<std::string> values = {},
                          int64_t number = 0, uint32_t u32 = 0);

}  // namespace ddprun::scale
