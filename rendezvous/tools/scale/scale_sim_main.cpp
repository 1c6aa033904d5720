// ddprun_scale_sim: N simulated agents and their N x P simulated PyTorch workers against a
// real rendezvous server (sim.h says what each does), from thousands of sockets per thread.
//   ddprun_scale_sim --port P --agents N [--nproc 8] [--token T] [--threads K]
//                    [--no-workers] [--gloo] [--server-pid PID ...] [--probe]
//                    [--offer-store PORT | --store-at HOST:PORT] [--store-pid PID] [--relay]
//                    [--part K --parts M --hold-file F] [--kill-one --min-nodes M]
//                    [--churn PCT --min-nodes M] [--expect-restart --ready-file F --offer-store PORT]
// Timeline, in ms from the first JOIN: every agent has its ROUND; every worker joined the
// store (ADD init/); every worker past the barrier; every worker done (NCCL id, Gloo).
// Prints one machine-readable "RESULT key=value ..." line; exit 0 only when every worker got
// through with a unique rank and nothing went wrong.
#include <arpa/inet.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "sim.h"
#include "sim_phases.h"
#include "sim_probe.h"

using namespace ddprun::scale;

namespace {

// One loop thread: its share of the agents (every threads-th), and their workers.
void run_loop(Shared& s, Loop& loop, std::vector<std::unique_ptr<Agent>>& agents, const sockaddr_in& server) {
  for (auto& a : agents)
    if (!a->late()) a->start(loop, server);
  bool joined = false, killed = false, churned = false, rechecked = false;
  auto next_beat = Clock::now();
  const auto beat = std::chrono::milliseconds(s.o.heartbeat_ms);
  while (!s.stop.load()) {
    if (!joined && s.go_join.load()) {
      for (auto& a : agents)
        if (a->handshaken()) a->send_join(loop);
      joined = true;
      next_beat = Clock::now() + beat;
    }
    if (!killed && s.kill_index.load() >= 0) {
      killed = true;
      for (auto& a : agents)
        if (a->index() == s.kill_index.load()) a->die(loop);
    }
    if (!churned && s.churn.load()) {
      churned = true;
      for (auto& a : agents) {
        if (a->late()) a->start_late(loop, server);
        else if (const uint8_t l = s.leavers[static_cast<size_t>(a->index())]) a->leave(loop, l == 2);
      }
    }
    if (s.o.expect_restart)
      for (auto& a : agents) a->tick(loop, Clock::now());
    if (!rechecked && s.recheck.load()) {
      rechecked = true;
      for (auto& a : agents) a->recheck(loop);
    }
    if (joined && Clock::now() >= next_beat) {
      for (auto& a : agents) a->heartbeat(loop);
      next_beat += beat;
    }
    loop.poll(joined ? 10 : 5);
  }
}

std::string ms(int64_t ns_from, int64_t ns_to) {
  if (!ns_to) return "-1";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(ns_to - ns_from) / 1e6);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::vector<int> server_pids;
  bool probe = false;
  CLI::App app{"simulate N agents and their N x P PyTorch workers against a ddprun rendezvous server"};
  app.add_option("--host", o.host, "the rendezvous server's IPv4 address");
  app.add_option("--port", o.port, "the rendezvous server's port");
  app.add_option("--agents", o.agents, "simulated agents (nodes)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--nproc", o.nproc, "workers per agent")->check(CLI::Range(1, 1024));
  app.add_option("--run-id", o.run_id);
  app.add_option("--token", o.token, "the rendezvous token: handshake and a MAC on every message");
  app.add_option("--threads", o.threads, "event-loop threads")->check(CLI::Range(1, 256));
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "each agent's heartbeat period")->check(CLI::Range(10, 600000));
  app.add_option("--timeout", o.timeout_s, "give up after this many seconds")->check(CLI::Range(1.0, 3600.0));
  app.add_flag("!--no-workers", o.workers, "agents only: stop once every agent has its ROUND");
  app.add_flag("--gloo", o.gloo, "also Gloo's full-mesh address exchange (world^2 reads: small worlds only)");
  app.add_flag("!--one-source", o.source_ips, "connect every socket from 127.0.0.1, not one address per node");
  app.add_option("--server-pid", server_pids, "a server process to report CPU time and peak RSS of");
  int store_pid = 0;
  app.add_option("--offer-store", o.store_offer_port,
                 "every agent offers a workers' store on this port, as agents of a standing ddprund do; node "
                 "rank 0's address must reach it (a ddprund listening on every address, say)")
      ->check(CLI::Range(1, 65535));
  std::string store_at;
  app.add_option("--store-at", store_at,
                 "HOST:PORT: the workers use this store, not the round's (PyTorch's own TCPStore server, say)");
  app.add_option("--store-pid", store_pid,
                 "the process serving the workers' store (--offer-store, --store-at): its "
                 "CPU time and peak RSS");
  bool kill_one = false;
  app.add_flag("--kill-one", kill_one,
               "once every worker is through, one agent's node dies (its connections close, no LEAVE): time until "
               "every survivor has its new ROUND and every surviving worker is through again (needs --min-nodes "
               "below --agents)");
  app.add_option("--churn", o.churn_pct,
                 "once every worker is through, this % of the agents leave (every other one with a LEAVE, the rest "
                 "just close) and as many new agents join: time until a round holds every agent and its workers are "
                 "through (needs --min-nodes at most the agents that stay)")
      ->check(CLI::Range(0.001, 50.0));
  std::string ready_file;
  app.add_flag("--expect-restart", o.expect_restart,
               "the server is killed and started again (same port and token) once every worker is through: the "
               "agents reconnect with backoff and re-join their round (needs --offer-store: the round's store on "
               "node rank 0 outlives the server)");
  app.add_option("--ready-file", ready_file,
                 "--expect-restart: created when every worker is through (kill the server then)");
  app.add_option("--min-nodes", o.min_nodes, "the JOINs' min_nodes (default: --agents)")->check(CLI::Range(1, 1 << 20));
  app.add_flag("--relay", o.relay, "each node's workers reach the store over one multiplexed connection (a relay)");
  app.add_option("--part", o.part, "this process simulates the agents i with i % parts == part")
      ->check(CLI::Range(0, 255));
  app.add_option("--parts", o.parts, "processes that share the agents (each with its own descriptors)")
      ->check(CLI::Range(1, 256));
  std::string hold_file;
  app.add_option("--hold-file", hold_file, "when done, keep every connection open until this file exists (--parts)");
  app.add_flag("--probe", probe, "another job's GETs on the server's own port meanwhile (latency p50/p99)");
  CLI11_PARSE(app, argc, argv);
  if (!store_at.empty()) {
    const auto colon = store_at.rfind(':');
    int port = 0;
    if (colon != std::string::npos) port = std::atoi(store_at.c_str() + colon + 1);
    if (colon == std::string::npos || port < 1 || port > 65535) {
      std::fprintf(stderr,
                   "ddprun_scale_sim: --store-at %s: give HOST:PORT, an IPv4 address and a port (127.0.0.1:29500)\n",
                   store_at.c_str());
      return 2;
    }
    o.store_at_host = store_at.substr(0, colon);
    o.store_at_port = port;
  }
  const int64_t world = static_cast<int64_t>(o.agents) * o.nproc;
  if ((kill_one || o.churn_pct > 0 || o.expect_restart) && o.parts > 1) {
    std::fprintf(stderr,
                 "ddprun_scale_sim: --kill-one, --churn and --expect-restart run in one process (no --parts)\n");
    return 2;
  }
  if (kill_one + (o.churn_pct > 0) + o.expect_restart > 1) {
    std::fprintf(stderr, "ddprun_scale_sim: --kill-one, --churn and --expect-restart are separate runs: give one\n");
    return 2;
  }
  const int64_t churn = churn_count(o);
  if (churn && (o.min_nodes == 0 || o.min_nodes > o.agents - churn || o.store_at_port || o.store_offer_port)) {
    std::fprintf(stderr,
                 "ddprun_scale_sim: --churn %g makes %lld of %d agents leave: give --min-nodes at most %lld "
                 "(else the job ends with them) and keep the round's own store on the server (no --store-at or "
                 "--offer-store)\n",
                 o.churn_pct, static_cast<long long>(churn), o.agents, static_cast<long long>(o.agents - churn));
    return 2;
  }
  if (o.expect_restart && o.workers && !o.store_offer_port) {
    std::fprintf(stderr,
                 "ddprun_scale_sim: --expect-restart needs --offer-store PORT (the workers' store on node rank "
                 "0, which outlives the server; a store on the server goes with it and its workers would fail), or "
                 "--no-workers\n");
    return 2;
  }
  if (o.part >= o.parts) {
    std::fprintf(stderr, "ddprun_scale_sim: --part %d is not below --parts %d\n", o.part, o.parts);
    return 2;
  }
  // This process's share: its agents and their workers (all of them with one part).
  const int64_t mine = (o.agents - o.part + o.parts - 1) / o.parts;
  const int64_t my_world = mine * o.nproc;
  if (o.gloo && world > 4096) {
    std::fprintf(stderr,
                 "ddprun_scale_sim: --gloo with %lld workers would read %lld addresses from the store "
                 "(world^2); use it with at most 4096 workers\n",
                 static_cast<long long>(world), static_cast<long long>(world * world));
    return 2;
  }
  if (kill_one && (o.min_nodes == 0 || o.min_nodes >= o.agents || o.store_at_port || o.store_offer_port)) {
    std::fprintf(
        stderr,
        "ddprun_scale_sim: --kill-one needs --min-nodes below --agents (else the job ends with the "
        "node) and the round's own store on the server (no --store-at or --offer-store: one store for both rounds "
        "keeps the first one's keys)\n");
    return 2;
  }
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  const int64_t need = mine + churn + (o.workers ? (o.relay ? mine + churn : my_world + churn * o.nproc) : 0) + 64;
  if (static_cast<int64_t>(rl.rlim_cur) < need) {
    std::fprintf(stderr,
                 "ddprun_scale_sim: %lld agents with %d workers each need %lld file descriptors, the limit "
                 "(ulimit -Hn) is %llu; raise it or simulate fewer (--agents, --nproc, --no-workers)\n",
                 static_cast<long long>(mine), o.workers ? (o.relay ? 1 : o.nproc) : 0, static_cast<long long>(need),
                 static_cast<unsigned long long>(rl.rlim_cur));
    return 2;
  }
  sockaddr_in server{};
  server.sin_family = AF_INET;
  server.sin_port = htons(o.port);
  if (inet_pton(AF_INET, o.host.c_str(), &server.sin_addr) != 1) {
    std::fprintf(stderr, "ddprun_scale_sim: --host %s is no IPv4 address\n", o.host.c_str());
    return 2;
  }

  Shared s(o);
  s.rank_seen.reset(new std::atomic<uint8_t>[static_cast<size_t>(world)]());
  s.rank_seen_n = world;
  std::vector<std::unique_ptr<Loop>> loops;
  std::vector<std::vector<std::unique_ptr<Agent>>> shares(static_cast<size_t>(o.threads));
  for (int i = 0; i < o.threads; ++i) loops.push_back(std::make_unique<Loop>());
  for (int64_t i = o.part, k = 0; i < o.agents; i += o.parts, ++k)
    shares[static_cast<size_t>(k % o.threads)].push_back(std::make_unique<Agent>(s, i));
  // --churn's new agents: new node ids and source addresses, started when the churn begins.
  for (int64_t i = o.agents; i < o.agents + churn; ++i)
    shares[static_cast<size_t>(i % o.threads)].push_back(std::make_unique<Agent>(s, i, true));
  if (churn) pick_leavers(s);
  std::vector<std::thread> threads;
  for (int i = 0; i < o.threads; ++i)
    threads.emplace_back(run_loop, std::ref(s), std::ref(*loops[static_cast<size_t>(i)]),
                         std::ref(shares[static_cast<size_t>(i)]), std::cref(server));

  const auto deadline = Clock::now() + std::chrono::duration<double>(o.timeout_s);
  auto wait_for = [&](auto done) {
    while (!done() && s.errors.load() == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done();
  };
  bool ok = wait_for([&] { return s.handshaken.load() == mine; });
  const int64_t t_connected = s.now_ns();
  std::vector<ProcStats> before;
  for (int pid : server_pids) before.push_back(proc_stats(pid));
  const ProcStats store_before = store_pid ? proc_stats(store_pid) : ProcStats{};
  std::unique_ptr<Probe> prober;
  std::thread probe_thread;
  std::atomic<bool> probe_stop{false};
  if (ok && probe) {
    prober = std::make_unique<Probe>(o.host, o.port);
    if (!prober->connected()) s.error("the probe could not connect to the server's own store");
    else probe_thread = std::thread([&] { prober->run(probe_stop); });
  }
  if (ok) {
    s.go_join.store(true);
    for (auto& l : loops) l->wake();
    ok = wait_for([&] { return o.workers ? s.workers_done.load() == my_world : s.rounds.load() == mine; });
  }
  // Phase 1's marks, before a failure raises them.
  const int64_t p1_round = s.t_last_round.load(), p1_joined = s.t_last_joined.load(),
                p1_barrier = s.t_last_barrier.load(), p1_done = s.t_last_done.load();
  int64_t t_kill = 0;
  const auto until = std::chrono::time_point_cast<Clock::duration>(deadline);
  if (ok && kill_one) t_kill = failure_phase(s, loops, until, ok);
  ChurnResult churned;
  if (ok && churn) churned = churn_phase(s, loops, until, ok);
  if (ok && o.expect_restart) restart_phase(s, loops, ready_file, until, ok);
  const int64_t t_end = s.now_ns();
  probe_stop.store(true);
  if (probe_thread.joinable()) probe_thread.join();
  std::vector<ProcStats> after;
  for (int pid : server_pids) after.push_back(proc_stats(pid));
  const ProcStats store_after = store_pid ? proc_stats(store_pid) : ProcStats{};

  const int64_t j0 = s.t_first_join.load();
  double cpu = 0, rss = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    cpu += after[i].cpu_s - before[i].cpu_s;
    rss += after[i].peak_rss_mib;
  }
  long double rank_sum = 0, rank_sq_sum = 0;
  int64_t ranks_seen = 0;
  for (int64_t r = 0; r < s.rank_seen_n; ++r)
    if (s.rank_seen[static_cast<size_t>(r)].load()) {
      ++ranks_seen;
      rank_sum += static_cast<long double>(r);
      rank_sq_sum += static_cast<long double>(r) * static_cast<long double>(r);
    }
  const auto start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(s.start.time_since_epoch()).count();
  std::printf("RESULT agents=%d nproc=%d world=%lld token=%d threads=%d relay=%d part=%d parts=%d connect_ms=%s "
              "round_ms=%s workers_joined_ms=%s barrier_ms=%s done_ms=%s rounds=%lld workers_done=%lld dup_ranks=%lld "
              "errors=%lld server_cpu_s=%.2f server_peak_rss_mib=%.1f probe_ops=%zu probe_p50_us=%.0f "
              "probe_p99_us=%.0f store_host_cpu_s=%.2f store_host_peak_rss_mib=%.1f",
              o.agents, o.nproc, static_cast<long long>(world), !o.token.empty(), o.threads, o.relay ? 1 : 0, o.part,
              o.parts, ms(0, t_connected).c_str(), ms(j0, p1_round).c_str(), ms(j0, p1_joined).c_str(),
              ms(j0, p1_barrier).c_str(), ms(j0, p1_done).c_str(), static_cast<long long>(s.rounds.load()),
              static_cast<long long>(s.workers_done.load()), static_cast<long long>(s.duplicate_ranks.load()),
              static_cast<long long>(s.errors.load()), cpu, rss, prober ? prober->ops() : 0,
              prober ? prober->quantile(0.5) : -1.0, prober ? prober->quantile(0.99) : -1.0,
              store_after.cpu_s - store_before.cpu_s, store_after.peak_rss_mib);
  // After a death (--kill-one), from it: every survivor told (RESTART), every survivor's new
  // ROUND, every surviving worker joined the new store, past its barrier, done.
  if (kill_one)
    std::printf(
        " kill_restart_ms=%s kill_round_ms=%s kill_joined_ms=%s kill_barrier_ms=%s kill_done_ms=%s restarts=%lld",
        ms(t_kill, s.t_last_restart.load()).c_str(), ms(t_kill, s.t_last_round.load()).c_str(),
        ms(t_kill, s.t_last_joined.load()).c_str(), ms(t_kill, s.t_last_barrier.load()).c_str(),
        ms(t_kill, s.t_last_done.load()).c_str(), static_cast<long long>(s.restarts.load()));
  if (churn) std::printf("%s", churn_fields(s, churned).c_str());
  if (o.expect_restart) std::printf("%s", restart_fields(s).c_str());
  // For merging --parts: this process's marks on the shared monotonic clock, and its ranks.
  std::printf(" start_mono_ns=%lld first_join_ns=%lld last_round_ns=%lld last_joined_ns=%lld last_barrier_ns=%lld "
              "last_done_ns=%lld ranks_seen=%lld rank_sum=%.0Lf rank_sq_sum=%.0Lf",
              static_cast<long long>(start_ns), static_cast<long long>(j0), static_cast<long long>(p1_round),
              static_cast<long long>(p1_joined), static_cast<long long>(p1_barrier), static_cast<long long>(p1_done),
              static_cast<long long>(ranks_seen), rank_sum, rank_sq_sum);
  std::printf(" ok=%d\n", ok ? 1 : 0);
  if (!ok)
    std::fprintf(stderr,
                 "ddprun_scale_sim: %s after %.1f s: %lld of %d agents handshaken, %lld rounds, %lld of %lld "
                 "workers joined, %lld past the barrier, %lld done\n",
                 s.errors.load() ? "stopped on an error" : "timed out", static_cast<double>(t_end) / 1e9,
                 static_cast<long long>(s.handshaken.load()), static_cast<int>(mine),
                 static_cast<long long>(s.rounds.load()), static_cast<long long>(s.workers_joined.load()),
                 static_cast<long long>(my_world), static_cast<long long>(s.barrier_passed.load()),
                 static_cast<long long>(s.workers_done.load()));
  std::fflush(stdout);
  // The other parts' agents are still in the round: closing ours now would fail the job for them.
  while (!hold_file.empty() && ::access(hold_file.c_str(), F_OK) != 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s.stop.store(true);
  for (auto& l : loops) l->wake();
  for (auto& t : threads) t.join();
  const bool clean = ok && s.errors.load() == 0 && s.duplicate_ranks.load() == 0 && (!prober || !prober->failed());
  return clean ? 0 : 1;
}
