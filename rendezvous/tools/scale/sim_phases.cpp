// The phases after the first round (sim_phases.h).
#include "sim_phases.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

namespace ddprun::scale {

namespace {

bool wait_until(Shared& s, Deadline deadline, auto done) {
  while (!done() && s.errors.load() == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

std::string ms(int64_t ns_from, int64_t ns_to) {
  if (!ns_to || !ns_from) return "-1";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(ns_to - ns_from) / 1e6);
  return b;
}

}  // namespace

int64_t failure_phase(Shared& s, std::vector<std::unique_ptr<Loop>>& loops, Deadline deadline, bool& ok) {
  const Options& o = s.o;
  const int64_t rounds0 = s.rounds.load(), done0 = s.workers_done.load();
  const int64_t survivors = o.agents - 1, world = survivors * o.nproc;
  // Every worker of the last round is done: nobody reads these until the next ROUND.
  s.rank_seen.reset(new std::atomic<uint8_t>[static_cast<size_t>(world)]());
  s.rank_seen_n = world;
  s.world_size.store(-1);
  const int64_t t_kill = s.now_ns();
  s.kill_index.store(o.agents / 2);
  for (auto& l : loops) l->wake();
  ok = wait_until(s, deadline, [&] {
    return s.rounds.load() == rounds0 + survivors && (!o.workers || s.workers_done.load() == done0 + world);
  });
  return t_kill;
}

int64_t churn_count(const Options& o) {
  if (o.churn_pct <= 0) return 0;
  return std::max<int64_t>(1, std::llround(o.agents * o.churn_pct / 100.0));
}

// Spread over the agents (node rank 0's among them when the spread lands there); every
// other leaver says LEAVE, the rest just close.
void pick_leavers(Shared& s) {
  const int64_t n = s.o.agents, k = churn_count(s.o);
  s.leavers.assign(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < k; ++j) s.leavers[static_cast<size_t>((j * n + n / 2) / k % n)] = j % 2 ? 1 : 2;
}

ChurnResult churn_phase(Shared& s, std::vector<std::unique_ptr<Loop>>& loops, Deadline deadline, bool& ok) {
  const Options& o = s.o;
  const int64_t world = static_cast<int64_t>(o.agents) * o.nproc;
  ChurnResult c;
  s.tolerate_store_loss.store(true);
  s.tally_rounds.store(true);
  c.t_churn = s.now_ns();
  s.churn.store(true);
  for (auto& l : loops) l->wake();
  // Done: a round that every one of the N agents got, and (with workers) all its workers through.
  auto whole = [&] {
    std::lock_guard lock(s.tally_mu);
    for (auto& [round, t] : s.tally)
      if (t.agents == o.agents && (!o.workers || t.done == world)) {
        c.round = round;
        c.last = t;
        return true;
      }
    return false;
  };
  ok = wait_until(s, deadline, whole);
  std::lock_guard lock(s.tally_mu);
  c.rounds = static_cast<int64_t>(s.tally.size());
  ok = ok && c.last.world == world && c.last.dup_ranks == 0;
  return c;
}

void restart_phase(Shared& s, std::vector<std::unique_ptr<Loop>>& loops, const std::string& ready_file,
                   Deadline deadline, bool& ok) {
  const int64_t n = s.o.agents, world = n * s.o.nproc;
  if (!ready_file.empty()) std::ofstream(ready_file) << "every worker is through\n";
  else std::fprintf(stderr, "ddprun_scale_sim: every worker is through: restart the server now\n");
  ok = wait_until(s, deadline, [&] { return s.rejoined.load() == n && s.jobs_done.load() == n; });
  if (!ok || !s.o.workers) return;
  s.recheck.store(true);
  for (auto& l : loops) l->wake();
  ok = wait_until(s, deadline, [&] { return s.rechecked.load() == world; });
}

std::string churn_fields(const Shared& s, const ChurnResult& c) {
  const int64_t k = churn_count(s.o);
  char b[512];
  std::snprintf(b, sizeof b,
                " churn_left=%lld churn_joined=%lld churn_rounds=%lld churn_round_nodes=%lld churn_world=%lld "
                "churn_workers_done=%lld churn_dup_ranks=%lld churn_restart_count=%lld restarts=%lld "
                "churn_restart_ms=%s churn_round_ms=%s churn_done_ms=%s",
                static_cast<long long>(k), static_cast<long long>(k), static_cast<long long>(c.rounds),
                static_cast<long long>(c.last.agents), static_cast<long long>(c.last.world),
                static_cast<long long>(c.last.done), static_cast<long long>(c.last.dup_ranks),
                static_cast<long long>(c.last.restart_count), static_cast<long long>(s.restarts.load()),
                ms(c.t_churn, s.t_last_restart.load()).c_str(), ms(c.t_churn, c.last.t_last_round).c_str(),
                ms(c.t_churn, c.last.t_last_done).c_str());
  return b;
}

std::string restart_fields(const Shared& s) {
  const int64_t t0 = s.t_first_loss.load();
  char b[512];
  std::snprintf(b, sizeof b,
                " restart_lost=%lld restart_rejoined=%lld restart_jobs_done=%lld restart_attempts=%lld restarts=%lld "
                "restart_workers_rechecked=%lld restart_rejoin_ms=%s restart_resumed_ms=%s",
                static_cast<long long>(s.lost.load()), static_cast<long long>(s.rejoined.load()),
                static_cast<long long>(s.jobs_done.load()), static_cast<long long>(s.attempts.load()),
                static_cast<long long>(s.restarts.load()), static_cast<long long>(s.rechecked.load()),
                ms(t0, s.t_last_rejoin.load()).c_str(),
                ms(t0, s.t_last_job_done.load()).c_str());
  return b;
}

}  // namespace ddprun::scale
