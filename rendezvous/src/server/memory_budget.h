// One memory budget for the whole server (StoreServerOptions::max_memory, ddprund
// --max-memory): what every keyspace holds (keys, values, queued items, the keys its waiters
// and watchers name), the bytes queued for every connection (replies and events in flight,
// counted by their wire size, so a value held only by a reply still counts), and every
// connection's input buffer. A request that would pass it is refused, naming the limit.
//
// glibc keeps freed memory in its arenas; after a large release (an attack's connections
// closed: what is held fell 32 MiB below its peak) trim_if_due() hands it back to the system,
// at most once a second.
//
// Thread-safety: every method may be called from any thread; trim_if_due() with no lock held.
#pragma once

#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace ddprun::server {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  // Adds n unless that would pass the limit; false: refused, nothing added. `modest`: the
  // holder (a connection's outbox or input buffer) stays small with it; it may then use a
  // reserve of an eighth of the limit past it, so that connections that read their replies
  // are still served while others have filled the budget with replies they do not read.
  bool try_charge(uint64_t n, bool modest = false) {
    const uint64_t cap = modest ? limit_ + limit_ / 8 : limit_;
    uint64_t cur = used_.load(std::memory_order_relaxed);
    do {
      if (cur + n > cap) return false;
    } while (!used_.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
    raise_peak(cur + n);
    return true;
  }
  // What a holder may keep and still count as modest.
  static constexpr uint64_t kModestBytes = 256 * 1024;
  // Adds n whatever the limit (a few bytes an agent must get, e.g. its ERROR).
  void charge(uint64_t n) { raise_peak(used_.fetch_add(n, std::memory_order_relaxed) + n); }
  // One atomic add: every reply and read passes here, from every I/O thread.
  void release(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }
  // A holder whose size is known only as a total (a keyspace's state): its charge becomes `now`.
  void settle(uint64_t& charged, uint64_t now) {
    if (now == charged) return;  // most requests: no shared write at all
    if (now > charged) charge(now - charged);
    else release(charged - now);
    charged = now;
  }
  bool fits(uint64_t n) const { return used_.load(std::memory_order_relaxed) + n <= limit_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  // What may still be charged now (modest holders: with the reserve).
  uint64_t room(bool modest = false) const {
    const uint64_t cap = modest ? limit_ + limit_ / 8 : limit_;
    const uint64_t u = used();
    return u < cap ? cap - u : 0;
  }
  uint64_t limit() const { return limit_; }
  // Why a request of `more` bytes is refused.
  std::string refusal(uint64_t more) const {
    return "the server holds " + std::to_string(used()) +
           " bytes (stored data, replies and requests in flight); " + std::to_string(more) +
           " more would pass the limit of " + std::to_string(limit_) + " (--max-memory)";
  }

  // Trims once what is held has fallen kTrimAfterBytes below its peak since the last trim
  // (read-only while it has not: called after every batch of requests).
  void trim_if_due() {
    const uint64_t peak = peak_.load(std::memory_order_relaxed), u = used();
    if (peak < u + kTrimAfterBytes) return;
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    int64_t last = last_trim_.load(std::memory_order_relaxed);
    if (now - last < std::chrono::steady_clock::duration(std::chrono::seconds(1)).count()) return;
    if (!last_trim_.compare_exchange_strong(last, now)) return;  // another thread trims
    peak_.store(u, std::memory_order_relaxed);
    ::malloc_trim(0);
  }

 private:
  static constexpr uint64_t kTrimAfterBytes = 32ull << 20;
  // A load, and a write only when a new peak is reached (rare once a server is warm).
  void raise_peak(uint64_t now) {
    uint64_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
  alignas(64) std::atomic<uint64_t> peak_{0};  // its own cache line: read by every batch
  std::atomic<int64_t> last_trim_{0};
};

}  // namespace ddprun::server
