// One memory budget for the whole server (StoreServerOptions::max_memory, ddprund
// --max-memory): what every keyspace holds (keys, values, queued items, the keys its waiters
// and watchers name), the bytes queued for every connection (replies and events in flight,
// counted by their wire size, so a value held only by a reply still counts), and every
// connection's input buffer (by capacity), the parsed copy of a large request while it is
// applied, and a fixed cost per open connection. A request that would pass it is refused,
// naming the limit.
//
// What it does not count (the allocator's slack, socket buffers, threads, the program) is what
// the default --max-memory leaves room for under a cgroup memory limit (memory_limit.h).
//
// glibc keeps freed memory in its arenas; after a large release (an attack's connections
// closed: what is held fell 32 MiB below its peak) trim_if_due() hands it back to the system,
// at most once a second: after requests and closes, and from a timer while the server is idle.
//
// Each I/O thread keeps a little credit of its own (bind_thread): its charges and releases move
// the shared counter only in steps of a slack (64 KiB, less for small limits), so threads do
// not all write one cache line for every request. The counter includes the credits, so a
// refusal may come up to (threads x 2 slacks) early, never late.
//
// Thread-safety: every method may be called from any thread; trim_if_due() with no lock held.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace ddprun::server {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit)
      : limit_(limit), slack_(std::max<uint64_t>(1, std::min<uint64_t>(kMaxSlackBytes, limit / 1024))) {}

  // A thread's own credit: bytes counted in the shared total that it has not used yet.
  struct alignas(64) Credit {
    uint64_t bytes = 0;
  };
  // The calling thread uses `credit` (owned by it, kept alive while it runs) from now on.
  void bind_thread(Credit* credit) {
    tl_owner_ = this;
    tl_credit_ = credit;
  }
  // Gives the calling thread's credit back (when it ends).
  void unbind_thread() {
    if (Credit* c = own()) {
      used_.fetch_sub(c->bytes, std::memory_order_relaxed);
      c->bytes = 0;
      tl_owner_ = nullptr;
      tl_credit_ = nullptr;
    }
  }

  // Adds n unless that would pass the limit; false: refused, nothing added. `modest`: the
  // holder (a connection's outbox or input buffer) stays small with it; it may then use a
  // reserve of an eighth of the limit past it, so that connections that read their replies
  // are still served while others have filled the budget with replies they do not read.
  bool try_charge(uint64_t n, bool modest = false) {
    Credit* c = own();
    if (c && c->bytes >= n) {
      c->bytes -= n;
      return true;
    }
    // The shared total grows by what the credit lacks, plus a slack to spare when it fits.
    const uint64_t lack = c ? n - c->bytes : n;
    const uint64_t cap = modest ? limit_ + limit_ / 8 : limit_;
    uint64_t cur = used_.load(std::memory_order_relaxed), add = 0;
    do {
      if (cur + lack > cap) return false;
      add = c && cur + lack + slack_ <= cap ? lack + slack_ : lack;
    } while (!used_.compare_exchange_weak(cur, cur + add, std::memory_order_relaxed));
    raise_peak(cur + add);
    if (c) c->bytes = c->bytes + add - n;
    return true;
  }
  // What a holder may keep and still count as modest.
  static constexpr uint64_t kModestBytes = 256 * 1024;
  // Adds n whatever the limit (a few bytes an agent must get, e.g. its ERROR).
  void charge(uint64_t n) {
    Credit* c = own();
    if (c && c->bytes >= n) {
      c->bytes -= n;
      return;
    }
    const uint64_t lack = c ? n - c->bytes + slack_ : n;
    raise_peak(used_.fetch_add(lack, std::memory_order_relaxed) + lack);
    if (c) c->bytes = slack_;
  }
  // Every reply and read passes here, from every I/O thread: kept in the thread's credit up to
  // two slacks, the rest handed back.
  void release(uint64_t n) {
    Credit* c = own();
    if (!c) {
      used_.fetch_sub(n, std::memory_order_relaxed);
      return;
    }
    c->bytes += n;
    if (c->bytes > 2 * slack_) {
      used_.fetch_sub(c->bytes - slack_, std::memory_order_relaxed);
      c->bytes = slack_;
    }
  }
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
  static constexpr uint64_t kMaxSlackBytes = 64 * 1024;
  Credit* own() const { return tl_owner_ == this ? tl_credit_ : nullptr; }
  // A load, and a write only when a new peak is reached (rare once a server is warm).
  void raise_peak(uint64_t now) {
    uint64_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  const uint64_t limit_;
  const uint64_t slack_;
  inline static thread_local const MemoryBudget* tl_owner_ = nullptr;
  inline static thread_local Credit* tl_credit_ = nullptr;
  alignas(64) std::atomic<uint64_t> used_{0};
  alignas(64) std::atomic<uint64_t> peak_{0};  // its own cache line: read by every batch
  std::atomic<int64_t> last_trim_{0};
};

}  // namespace ddprun::server
