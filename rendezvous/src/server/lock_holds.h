// What held a state lock longest, per operation. Each lock site names itself (HoldSite) and
// a count of what it worked on (the agents the rounds knew, a batch's requests); a hold is
// measured from its acquisition to its release and noted after the release: two clock reads,
// no allocation, and a short mutex only when a site's longest grows.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::server {

enum class HoldSite : uint8_t {
  Handshake,        // an agent's handshake step (the rounds lock)
  Join,             // a JOIN that completed no round
  RoundCompletion,  // a JOIN or a tick that completed a round (its participants and ROUNDs)
  Heartbeat,        // HEARTBEAT
  AgentReport,      // FAILURE, SUCCEEDED, PROGRESS, LEAVE (a restart or the job's end among them)
  StatusQuery,      // `ddprun status`
  Tick,             // the rendezvous tick: heartbeat expiry and deadlines
  Disconnect,       // an agent's connection closed: the rounds forget it
  Admission,        // a connection's admission bookkeeping (its first bytes, first request, close)
  StoreRequests,    // a batch of TCPStore requests on one keyspace
  StoreDisconnect,  // a TCPStore connection's state forgotten (one slice)
  Relay,            // a store relay's channel opened
  Stats,            // the server's stats and metrics read
  kCount
};

inline const char* hold_site_name(HoldSite s) {
  static constexpr std::array<const char*, static_cast<size_t>(HoldSite::kCount)> names{
      "handshake",      "JOIN",      "round completion", "HEARTBEAT",        "agent report",  "STATUS_QUERY",
      "heartbeat tick", "disconnect", "admission",       "store requests",   "store disconnect", "relay channel",
      "stats"};
  return names[static_cast<size_t>(s)];
}

// What the count of a site's hold counts (nullptr: it has none).
inline const char* hold_site_unit(HoldSite s) {
  return s == HoldSite::StoreRequests ? "requests" : s == HoldSite::StoreDisconnect ? nullptr : "agents";
}

// One site's longest hold and the count it had then.
struct HoldEntry {
  HoldSite site = HoldSite::kCount;
  int64_t ns = 0;
  uint64_t count = 0;
  // "round completion, 16000 agents"
  std::string describe() const {
    if (site == HoldSite::kCount) return "";
    if (!hold_site_unit(site)) return hold_site_name(site);
    return std::string(hold_site_name(site)) + ", " + std::to_string(count) + " " + hold_site_unit(site);
  }
};

class HoldRecord {
 public:
  void note(HoldSite site, std::chrono::steady_clock::duration held, uint64_t count) {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(held).count();
    auto& slot = slots_[static_cast<size_t>(site)];
    if (ns <= slot.ns.load(std::memory_order_relaxed)) return;  // the common case: no lock
    std::lock_guard lock(mu_);
    if (ns <= slot.ns.load(std::memory_order_relaxed)) return;
    slot.ns.store(ns, std::memory_order_relaxed);
    slot.count = count;
  }
  // Every site that held a lock, longest first.
  std::vector<HoldEntry> entries() const {
    std::vector<HoldEntry> out;
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (const int64_t ns = slots_[i].ns.load(std::memory_order_relaxed); ns > 0)
        out.push_back({static_cast<HoldSite>(i), ns, slots_[i].count});
    std::sort(out.begin(), out.end(), [](const HoldEntry& a, const HoldEntry& b) { return a.ns > b.ns; });
    return out;
  }

 private:
  struct Slot {
    std::atomic<int64_t> ns{0};
    uint64_t count = 0;  // under mu_
  };
  mutable std::mutex mu_;
  std::array<Slot, static_cast<size_t>(HoldSite::kCount)> slots_;
};

// A lock held for one site: taken here (or later, acquire), let go at release or the end of
// the scope, and noted then. The site and count may change while it is held (set): a JOIN that
// completed a round is the round's completion.
template <class Lock>
class TimedHold {
 public:
  TimedHold(Lock& m, HoldRecord& record, HoldSite site, bool take = true) : m_(m), record_(record), site_(site) {
    if (take) acquire();
  }
  ~TimedHold() { release(); }
  TimedHold(const TimedHold&) = delete;
  TimedHold& operator=(const TimedHold&) = delete;
  void acquire() {
    if (owns_) return;
    m_.lock();
    owns_ = true;
    at_ = std::chrono::steady_clock::now();
  }
  void release() {
    if (!owns_) return;
    m_.unlock();
    owns_ = false;
    record_.note(site_, std::chrono::steady_clock::now() - at_, count_);
  }
  void set(HoldSite site, uint64_t count) { site_ = site, count_ = count; }
  void set_count(uint64_t count) { count_ = count; }
  HoldSite site() const { return site_; }
  bool owns() const { return owns_; }
  bool longer_than(std::chrono::steady_clock::duration d) const { return std::chrono::steady_clock::now() - at_ > d; }

 private:
  Lock& m_;
  HoldRecord& record_;
  HoldSite site_;
  uint64_t count_ = 0;
  bool owns_ = false;
  std::chrono::steady_clock::time_point at_;
};

}  // namespace ddprun::server
