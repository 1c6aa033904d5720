#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "ddprun/launcher/hang.h"

namespace ddprun::launcher {

std::vector<int> HangVerdict::stuck() const {
  std::vector<int> out;
  for (const auto& r : ranks) {
    if (r.stuck) out.push_back(r.local_rank);
  }
  return out;
}

namespace {
uint64_t le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

std::optional<StepStats> parse_step_stats(const unsigned char* page, size_t size) {
  if (page == nullptr || size < kStepStatsEnd || le64(page) != kProgressMagic) return std::nullopt;
  if (le64(page + kStepStatsOffset) != kStepStatsVersion) return std::nullopt;
  StepStats s;
  s.steps = le64(page + kStepStatsOffset + 8);
  s.step_ns = le64(page + kStepStatsOffset + 16);
  s.comm_ns = le64(page + kStepStatsOffset + 24);
  s.exposed_ns = le64(page + kStepStatsOffset + 32);
  return s;
}

HangWatch::HangWatch(double timeout_s) : timeout_s_(timeout_s) {}

void HangWatch::start_attempt(double now_s, int nproc) {
  attempt_start_s_ = now_s;
  last_.assign(static_cast<size_t>(std::max(nproc, 0)), 0);
  moved_at_.assign(last_.size(), now_s);
  attempt_ticking_ = false;
  fired_ = false;
}

HangVerdict HangWatch::observe(double now_s, const std::vector<std::optional<uint64_t>>& ticks) {
  HangVerdict v;
  const size_t n = std::min(ticks.size(), last_.size());
  bool first_tick = false;
  for (size_t i = 0; i < n; ++i) {
    if (!ticks[i] || *ticks[i] == last_[i]) continue;
    last_[i] = *ticks[i];
    moved_at_[i] = now_s;
    if (!attempt_ticking_) first_tick = true;
  }
  if (first_tick) {
    // Every rank's clock starts at the attempt's first tick: a rank slower to start is not
    // stuck for what it spent before anyone made progress.
    attempt_ticking_ = true;
    ever_ticked_ = true;
    for (size_t i = 0; i < n; ++i) moved_at_[i] = now_s;
  }
  if (!attempt_ticking_) {
    if (!ever_ticked_ && !never_said_ && now_s - attempt_start_s_ >= timeout_s_) {
      never_said_ = true;
      v.kind = HangVerdict::Kind::NeverTicked;
    }
    return v;
  }
  if (fired_) return v;
  uint64_t fewest = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < n; ++i) {
    if (!ticks[i]) continue;
    RankProgress r;
    r.local_rank = static_cast<int>(i);
    r.ticks = last_[i];
    r.last_move_s = moved_at_[i];
    r.stalled_s = now_s - moved_at_[i];
    r.stalled = r.stalled_s >= timeout_s_;
    if (r.stalled) fewest = std::min(fewest, r.ticks);
    v.ranks.push_back(r);
  }
  if (fewest == std::numeric_limits<uint64_t>::max()) return v;  // nobody stalled
  for (auto& r : v.ranks) r.stuck = r.stalled && r.ticks == fewest;
  v.kind = HangVerdict::Kind::Hung;
  fired_ = true;
  return v;
}

namespace {

std::string who(const RankProgress& r, const std::vector<RankIdentity>& ids) {
  const auto i = static_cast<size_t>(r.local_rank);
  if (i >= ids.size()) return fmt::format("local rank {}", r.local_rank);
  return fmt::format("r{} (local rank {}, pid {})", ids[i].global_rank, r.local_rank, ids[i].pid);
}

std::string since(const RankProgress& r, const std::vector<RankIdentity>& ids) {
  const auto i = static_cast<size_t>(r.local_rank);
  return i < ids.size() && !ids[i].since.empty() ? "since " + ids[i].since + ", " : "";
}

}  // namespace

std::string format_hang_message(const HangVerdict& v, const std::vector<RankIdentity>& ids, double timeout_s) {
  std::string stuck, others;
  size_t n_stuck = 0;
  for (const auto& r : v.ranks) {
    if (r.stuck) {
      ++n_stuck;
      stuck += fmt::format("{}{} made no progress for {:.0f} s ({}at tick {})", stuck.empty() ? "" : "; ", who(r, ids),
                           std::floor(r.stalled_s), since(r, ids), r.ticks);
      continue;
    }
    const auto i = static_cast<size_t>(r.local_rank);
    const std::string name = i < ids.size() ? fmt::format("r{}", ids[i].global_rank) : who(r, ids);
    std::string what;
    if (r.stalled)
      what = fmt::format("at tick {}, stalled {:.0f} s too (ahead: waiting for the stuck ranks?)", r.ticks,
                         std::floor(r.stalled_s));
    else what = fmt::format("at tick {}, moving (last tick {:.1f} s ago)", r.ticks, r.stalled_s);
    others += fmt::format("{}{} {}", others.empty() ? "" : ", ", name, what);
  }
  std::string out = fmt::format("hang: {} (--hang_timeout={:g})", stuck, timeout_s);
  if (!others.empty()) out += "; the others: " + others;
  else if (n_stuck > 1) out += "; every local rank is stuck at the same tick (waiting for another node?)";
  return out;
}

std::string format_never_ticked_message(double timeout_s) {
  return fmt::format(
      "--hang_timeout={:g}: no worker has reported progress in the {:g} s since the start, so there is no hang "
      "detection until one does (libddprun_worker ticks every step; a Python worker calls `import ddprun; "
      "ddprun.progress()` once per step)",
      timeout_s, timeout_s);
}

}  // namespace ddprun::launcher
