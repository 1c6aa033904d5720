// ddprun_store_bench: a TCPStore load generator built on ddprun's wire codec. Many
// connections from ONE process (epoll over non-blocking sockets, on --threads T threads that
// share the connections out; default 1), so the client is not the bottleneck: on a small
// machine one thread, on a many-core host as many as it takes to saturate the server. Works
// against any TCPStore server that speaks dialect D2 (ddprund, PyTorch 2.2+) or D0 (PyTorch 1.13).
//
//   ddprun_store_bench ops   --port P --op get|add|compare_set|wait --clients N --seconds S
//   ddprun_store_bench storm --port P --clients N [--timeout S]
//   common: --host H (default 127.0.0.1) --dialect D2|D0 --tag T (key namespace) --threads T
//           --source-ips K (connect from 127.0.1.1..K, like clients on K hosts; loopback only)
//
// ops: every connection runs a closed loop of one operation, like a PyTorch client would:
//   get = WAIT(k) + GET(k) (PyTorch's get()), add = ADD, compare_set = COMPARE_SET (always the
//   success branch, alternating values), wait = a wake-up hop: connection i SETs its
//   successor's key of round r, then WAITs for its own key of round r (set by its predecessor)
//   and GETs it; latency = from the predecessor's SET to this connection's wake-up. With
//   several threads each thread's connections form their own ring.
// storm: N connections connect at once, handshake (VALIDATE+PING on D2), ADD a counter, WAIT
//   on a last-worker key which the connection whose ADD returns N sets; the time until all N
//   are released. Resets/refusals/EOFs are counted (the goal is zero).
//
// Output: one line "RESULT key=value ..." (machine-readable), plus a human line on stderr.
#include "store_bench.h"

namespace {

using namespace ddprun_store_bench;

double pct(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i] / 1000.0;
}

int raise_fd_limit(int need) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  getrlimit(RLIMIT_NOFILE, &rl);
  (void)need;
  return static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 1 << 30));
}

const char* dname(Dialect d) { return d == Dialect::D0 ? "D0" : "D2"; }

// The connections [base, base + count) of each of o.threads generators.
std::vector<std::pair<int, int>> shares(const Options& o) {
  std::vector<std::pair<int, int>> out;
  const int t = std::max(1, std::min(o.threads, o.clients));
  for (int i = 0, base = 0; i < t; ++i) {
    const int count = o.clients / t + (i < o.clients % t ? 1 : 0);
    out.emplace_back(base, count);
    base += count;
  }
  return out;
}

// A start line every generator thread waits at, so the clock starts for all at once.
class StartLine {
 public:
  explicit StartLine(int n) : waiting_(n) {}
  void arrive_and_wait() {
    waiting_.fetch_sub(1);
    while (!go_.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  void wait_all_arrived() const {
    while (waiting_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  void go() { go_ = true; }

 private:
  std::atomic<int> waiting_;
  std::atomic<bool> go_{false};
};

int run_ops(const Options& o) {
  auto parts = shares(o);
  std::vector<std::unique_ptr<Bench>> benches;
  for (auto [base, count] : parts) benches.push_back(std::make_unique<Bench>(o, base, count));
  StartLine line(static_cast<int>(parts.size()));
  std::atomic<bool> setup_failed{false};
  Clock::time_point t0, stop_at;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < benches.size(); ++i) {
    threads.emplace_back([&, i] {
      Bench& b = *benches[i];
      b.stop_at_ = Clock::now() + std::chrono::hours(1);
      b.open_all(b.count());
      // Setup: connect + handshake every connection before the clock starts.
      auto setup_deadline = Clock::now() + std::chrono::seconds(30);
      if (!b.loop(setup_deadline, [&] { return b.handshaken_ + static_cast<int>(b.failures()) >= b.count(); }))
        setup_failed = true;
      line.arrive_and_wait();
      if (setup_failed) return;
      b.stop_at_ = stop_at;
      b.go();
      // Ops in flight at the deadline finish within a second; wait hops whose predecessor
      // stopped never would, so the loop ends there regardless.
      b.loop(b.stop_at_ + std::chrono::seconds(1), [&] { return b.finished_ >= b.count(); });
    });
  }
  line.wait_all_arrived();
  t0 = Clock::now();
  stop_at = t0 + std::chrono::microseconds(static_cast<long long>(o.seconds * 1e6));
  line.go();
  for (auto& t : threads) t.join();
  if (setup_failed) die("setup did not finish in 30 s");
  double elapsed = std::chrono::duration<double>(std::min(Clock::now(), stop_at) - t0).count();
  Stats all;
  for (auto& b : benches) all.add(b->st_);
  std::printf(
      "RESULT mode=ops op=%s clients=%d threads=%zu dialect=%s seconds=%.2f ops=%llu ops_per_s=%.0f p50_us=%.1f "
      "p99_us=%.1f resets=%llu refused=%llu eof=%llu errors=%llu\n",
      o.op.c_str(), o.clients, parts.size(), dname(o.dialect), elapsed, static_cast<unsigned long long>(all.ops),
      all.ops / elapsed, pct(all.lat_ns, 0.5), pct(all.lat_ns, 0.99), static_cast<unsigned long long>(all.resets),
      static_cast<unsigned long long>(all.refused), static_cast<unsigned long long>(all.eof),
      static_cast<unsigned long long>(all.other_errors));
  std::fflush(stdout);
  for (auto& b : benches) b->close_all();
  return 0;
}

int run_storm(const Options& o) {
  const int limit = raise_fd_limit(o.clients + 64);
  if (o.clients + 64 > limit) {
    std::printf("RESULT mode=storm clients=%d skipped=1 reason=fd_limit_%d\n", o.clients, limit);
    return 0;
  }
  auto parts = shares(o);
  std::vector<std::unique_ptr<Bench>> benches;
  for (auto [base, count] : parts) benches.push_back(std::make_unique<Bench>(o, base, count));
  StartLine line(static_cast<int>(parts.size()));
  Clock::time_point t0;
  std::atomic<int> completed{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < benches.size(); ++i) {
    threads.emplace_back([&, i] {
      Bench& b = *benches[i];
      line.arrive_and_wait();
      b.t_begin_ = t0;
      b.stage("past the start line");
      b.open_all(b.count());
      b.stage("every connect() issued");
      if (b.loop(t0 + std::chrono::microseconds(static_cast<long long>(o.timeout * 1e6)),
                 [&] { return b.finished_ >= b.count(); }))
        ++completed;
    });
  }
  line.wait_all_arrived();
  t0 = Clock::now();
  line.go();
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  Stats all;
  int released = 0, connected = 0, handshaken = 0, added = 0;
  for (auto& b : benches) {
    all.add(b->st_);
    released += b->released_;
    connected += b->connected_;
    handshaken += b->handshaken_storm_;
    added += b->added_;
  }
  const bool ok = completed == static_cast<int>(benches.size());
  std::printf("RESULT mode=storm clients=%d threads=%zu dialect=%s seconds=%.3f released=%d completed=%d connected=%d "
              "handshaken=%d added=%d resets=%llu refused=%llu eof=%llu errors=%llu\n",
              o.clients, parts.size(), dname(o.dialect), secs, released, ok ? 1 : 0, connected, handshaken, added,
              static_cast<unsigned long long>(all.resets), static_cast<unsigned long long>(all.refused),
              static_cast<unsigned long long>(all.eof), static_cast<unsigned long long>(all.other_errors));
  std::fflush(stdout);
  for (auto& b : benches) b->close_all();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc < 2)
    die("usage: ddprun_store_bench ops|storm --port P [--host H] [--op get|add|compare_set|wait] "
        "[--clients N] [--seconds S] [--timeout S] [--dialect D2|D0] [--tag T] [--threads T] [--source-ips K]");
  o.mode = argv[1];
  if (o.mode != "ops" && o.mode != "storm") die("mode must be ops or storm");
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--host") o.host = next();
    else if (a == "--port") o.port = static_cast<uint16_t>(std::atoi(next().c_str()));
    else if (a == "--op") o.op = next();
    else if (a == "--clients") o.clients = std::atoi(next().c_str());
    else if (a == "--seconds") o.seconds = std::atof(next().c_str());
    else if (a == "--timeout") o.timeout = std::atof(next().c_str());
    else if (a == "--tag") o.tag = next();
    else if (a == "--threads") o.threads = std::atoi(next().c_str());
    else if (a == "--source-ips") o.source_ips = std::atoi(next().c_str());
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--dialect") {
      auto d = next();
      if (d == "D0") o.dialect = Dialect::D0;
      else if (d == "D2") o.dialect = Dialect::D2;
      else die("--dialect must be D2 or D0");
    } else die("unknown argument " + a);
  }
  if (!o.port) die("--port is required");
  if (o.clients < 1) die("--clients must be >= 1");
  if (o.threads < 1) die("--threads must be >= 1");
  if (o.source_ips < 0 || o.source_ips > 250) die("--source-ips must be 0..250");
  if (o.source_ips > 0 && o.host.rfind("127.", 0) != 0) die("--source-ips needs a loopback --host (127.x.y.z)");
  if (o.op != "get" && o.op != "add" && o.op != "compare_set" && o.op != "wait")
    die("--op must be get|add|compare_set|wait");
  const int limit = raise_fd_limit(o.clients + 64);
  // Grow the descriptor table now, single-threaded: once the generator's threads run, every
  // doubling of a shared table waits for an RCU grace period (ms each), which showed up as most
  // of a small storm's time (54 ms of connect loop for 1024 connections, against 19 ms).
  if (const int fd = ::fcntl(2, F_DUPFD_CLOEXEC, std::min(limit, o.clients + 64) - 1); fd >= 0) ::close(fd);
  return o.mode == "ops" ? run_ops(o) : run_storm(o);
}
