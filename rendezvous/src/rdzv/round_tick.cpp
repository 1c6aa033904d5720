// RoundState: the passing of time (heartbeat expiry, the server's own stalls, deadlines).
#include <algorithm>

#include "ddprun/rdzv/round_state.h"
#include "round_state_detail.h"

namespace ddprun::rdzv {

using namespace detail;

Clock::duration RoundState::stall_for(const Job& job, Clock::duration gap) const {
  if (tick_period_) return gap > *tick_period_ + kStallSlack ? gap - *tick_period_ : Clock::duration::zero();
  return gap > job.heartbeat_timeout / 2 ? gap : Clock::duration::zero();
}

void RoundState::on_tick(Clock::time_point now, std::vector<Outbound>& out) {
  const Clock::duration gap = last_tick_ ? now - *last_tick_ : Clock::duration::zero();
  last_tick_ = jobs_.empty() ? std::nullopt : std::optional(now);
  last_stall_ = Clock::duration::zero();
  // First the stall, for every job, then the judgement: one clock for heartbeats and deadlines.
  for (auto& [id, job] : jobs_) {
    const Clock::duration stall = stall_for(job, gap);
    if (stall <= Clock::duration::zero()) continue;
    last_stall_ = std::max(last_stall_, stall);
    for (auto& [c, n] : job.members) n.last_seen = std::min(now, n.last_seen + stall);
    if (job.join_deadline) *job.join_deadline += stall;
    if (job.last_call_deadline) *job.last_call_deadline += stall;
  }
  std::vector<ConnId> expired;
  for (auto& [id, job] : jobs_)
    for (auto& [c, n] : job.members)
      if (now - n.last_seen > job.heartbeat_timeout) expired.push_back(c);
  for (ConnId c : expired) {
    auto cj = conn_job_.find(c);
    if (cj == conn_job_.end()) continue;
    Job& job = jobs_.at(cj->second);
    out.push_back({c, error_msg("no heartbeat for " + std::to_string(job.heartbeat_timeout.count()) +
                                    " ms: dropped from the job"),
                   true});
    const std::string run_id = cj->second;
    conn_job_.erase(cj);
    dropped_.insert(c);
    if (job.members.count(c)) node_lost(job, c, "heartbeat timeout", now, out);
    if (job.members.empty()) jobs_.erase(run_id);
  }
  for (auto& [id, job] : jobs_) {
    if (job.phase == Phase::Resuming && job.join_deadline && now >= *job.join_deadline) {
      resume_timed_out(job, now, out);
      continue;
    }
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
      fail_job(job, text, FailCause::Timeout, out);
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
