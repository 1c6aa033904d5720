// ddprund: a standing TCPStore-compatible store daemon (PyTorch 1.13 .. 2.11 clients).
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <stdexcept>
#include <thread>

#include "ddprun/common/knobs.h"
#include "ddprun/metrics/exposition.h"
#include "ddprun/metrics/store_metrics.h"
#include "ddprun/rdzv/agent_auth.h"
#include "ddprun/rdzv/auth_io.h"
#include "ddprun/server/memory_limit.h"
#include "ddprun/server/store_server.h"

#ifndef DDPRUN_VERSION  // set by the build (cmake/Packaging.cmake) from the project's version
#define DDPRUN_VERSION "unknown"
#endif

namespace {

struct DaemonOptions {
  std::string host;
  uint16_t port = 29400;
  std::string legacy_dialect = "1.13";
  std::string log_level = "info";
  std::string rdzv_token_file;
  std::string allow_open_rendezvous = "yes";
  int threads = 0;
  std::optional<uint16_t> metrics_port;  // unset: no metrics endpoint, nothing counted per request
  std::string metrics_host = "127.0.0.1";
  bool store_from_any_address = false;
  uint64_t max_key_len = ddprun::wire::Limits{}.max_key_len;
  uint64_t max_value_len = ddprun::wire::Limits{}.max_value_len;
  uint64_t max_keys = ddprun::wire::Limits{}.max_keys;
  uint64_t max_request_bytes = 0;  // 0: the default, or enough for the longest key and value
  uint64_t max_reply_bytes = ddprun::store::kDefaultMaxReplyBytes;
  uint64_t max_store_keys = ddprun::store::kDefaultMaxKeysPerStore;
  uint64_t max_store_bytes = ddprun::store::kDefaultMaxBytesPerStore;
  uint64_t max_connections = ddprun::server::kDefaultMaxConnections;
  uint64_t max_jobs = ddprun::server::kDefaultMaxJobs;
  uint64_t max_stranger_connections = 0;
  int64_t first_bytes_timeout_ms = ddprun::server::kDefaultFirstBytesTimeout.count();
  int64_t handshake_timeout_ms = ddprun::server::kDefaultHandshakeTimeout.count();
  uint64_t max_connection_buffered_bytes = ddprun::server::kDefaultMaxConnectionBufferedBytes;
  uint64_t max_buffered_bytes = ddprun::server::kDefaultMaxBufferedBytes;
  uint64_t max_memory = ddprun::server::kDefaultMaxMemory;
  uint64_t max_watches = ddprun::store::kDefaultMaxWatchesPerConnection;
  // Limits given on the command line; the others follow --max-value-len up when it needs it.
  bool reply_given = false, conn_buffer_given = false, buffer_given = false, memory_given = false;
};

void setup_options(CLI::App& app, DaemonOptions& o) {
  app.description("ddprund: a TCP store that speaks PyTorch's TCPStore protocol (1.13 to 2.11).");
  app.set_version_flag("--version", std::string("ddprund ") + DDPRUN_VERSION);
  app.add_option("--host", o.host, "address to listen on (default: every address, IPv6 and IPv4)");
  app.add_option("-p,--port", o.port, "TCP port; 0 picks a free one (printed on start)")->capture_default_str();
  app.add_option("--legacy-dialect", o.legacy_dialect,
                 "meaning of codes 7/8 for clients that send no VALIDATE: 1.13 (also 2.0) or 2.1")
      ->check(CLI::IsMember({"1.13", "2.0", "2.1"}))
      ->capture_default_str();
  app.add_option("--max-key-len", o.max_key_len, "longest key accepted, bytes")->capture_default_str();
  app.add_option("--max-value-len", o.max_value_len, "longest value accepted, bytes")->capture_default_str();
  app.add_option("--max-keys-per-request", o.max_keys, "most keys one CHECK/WAIT/MULTI_GET/MULTI_SET may name")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-request-bytes", o.max_request_bytes,
                 "largest request accepted, bytes (default " +
                     std::to_string(ddprun::wire::Limits{}.max_request_bytes) +
                     ", or more when --max-value-len needs it)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-reply-bytes", o.max_reply_bytes,
                 "largest reply one request may ask for (MULTI_GET, LIST_KEYS), bytes; a request past it is refused")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-store-keys", o.max_store_keys, "keys (and queues) one store may hold: the main one, each job's")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-store-bytes", o.max_store_bytes, "bytes of keys and values one store may hold")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-connections", o.max_connections,
                 "open connections in all (also kept below the descriptor limit); past it new ones are closed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-stranger-connections", o.max_stranger_connections,
                 "connections open at once from hosts that are neither loopback nor an admitted agent's; past it "
                 "a stranger's new one takes the slot of the stranger's oldest unproven connection (open 1 s or "
                 "more) or is closed, so members and token agents always find slots (0 = half of --max-connections)")
      ->capture_default_str();
  app.add_option("--first-bytes-timeout-ms", o.first_bytes_timeout_ms,
                 "a connection that has not sent enough to tell its protocol, or a TCPStore client that has made "
                 "no request after VALIDATE, this long after connecting is closed (0 = never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--handshake-timeout-ms", o.handshake_timeout_ms,
                 "an agent that has not finished the rendezvous handshake this long after announcing itself is "
                 "closed (0 = never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-jobs", o.max_jobs, "rendezvous jobs at once; a JOIN for one more gets an error")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-connection-buffered-bytes", o.max_connection_buffered_bytes,
                 "bytes queued for one peer that does not read them before it is dropped")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-buffered-bytes", o.max_buffered_bytes,
                 "bytes of partly received requests of all connections together")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-memory", o.max_memory,
                 "bytes the whole daemon may hold: every store's data, the keys waiters and watchers name, replies "
                 "queued for every connection (by wire size), requests being received and parsed, 8 KiB per "
                 "connection; a request past it is refused (default: 4 GiB, or " +
                     std::to_string(ddprun::server::kLimitShareNum) + "/" +
                     std::to_string(ddprun::server::kLimitShareDen) + " of this process's cgroup memory limit less " +
                     std::to_string(ddprun::server::kLimitReserveBytes >> 20) +
                     " MiB when that is less, e.g. under systemd's MemoryMax=)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-watches-per-connection", o.max_watches,
                 "distinct keys one PyTorch 1.13 client may watch (WATCH_KEY)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rdzv_token_file,--rdzv-token-file", o.rdzv_token_file,
                 "a file (mode 0600, yours) holding the rendezvous token (16+ bytes): agents must prove they hold "
                 "it (HMAC challenge-response, both ways) before they join; without it, DDPRUN_RDZV_TOKEN; without "
                 "either the rendezvous is open to anyone who can connect");
  app.add_option("--allow-open-rendezvous", o.allow_open_rendezvous,
                 "no: refuse to start without a rendezvous token (neither --rdzv-token-file nor "
                 "DDPRUN_RDZV_TOKEN), as the ddprund service does by default; yes: start anyway, open to anyone "
                 "who can connect")
      ->check(CLI::IsMember({"yes", "no"}))
      ->capture_default_str();
  app.add_flag("--store-from-any-address", o.store_from_any_address,
               "with a rendezvous token, still serve TCPStore clients of the main store from any address (by "
               "default only loopback and the hosts of admitted agents in a job's current round may use it)");
  app.add_option("--threads", o.threads,
                 "I/O threads; 0 = one per core, at most " + std::to_string(ddprun::server::kMaxAutoIoThreads))
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--metrics-port,--metrics_port", o.metrics_port,
                 "serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port, printed on start); "
                 "without it nothing is counted per request");
  app.add_option("--metrics-host,--metrics_host", o.metrics_host,
                 "address the metrics endpoint listens on (an address of this host; 0.0.0.0 = every IPv4 one)")
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

// Blocks of this size or more are mapped on their own and unmapped when freed. glibc's default
// raises the threshold to the largest block freed so far (up to 32 MiB), after which the large
// values and buffers of an attack stay in its arenas, held and fragmented, once freed: with it,
// the attacks of rendezvous.attack_memory peaked at 1.5x the budget, 1.1-1.25x without. (A
// lower threshold costs large values their speed: 256 KiB SET+GET ran at half the rate with
// 128 KiB.)
constexpr int kMmapThresholdBytes = 1 << 20;
// Fixing the threshold fixes this one too, at 128 KiB: the heap's top would be handed back and
// faulted in again on every large request. What it keeps is handed back when the server is idle
// (MemoryBudget::trim_if_due).
constexpr int kTrimThresholdBytes = 8 << 20;

// --max-memory: as given, else 4 GiB or what leaves room under this process's cgroup memory
// limit (systemd's MemoryMax=, a container's limit), whichever is less; never less than one
// request and one reply. `note`: what to log once the first line is out (a warning when
// `warn`).
struct MemoryChoice {
  uint64_t bytes = 0;
  std::string note;
  bool warn = false;
};

MemoryChoice resolve_max_memory(const DaemonOptions& o, uint64_t least) {
  namespace srv = ddprun::server;
  const auto cg = srv::read_cgroup_memory_limit();
  const uint64_t safe = cg ? srv::budget_under_limit(cg->bytes) : o.max_memory;
  const std::string limit = cg ? fmt::format("the memory limit of {} bytes ({})", cg->bytes, cg->file) : "";
  if (o.memory_given) {
    if (cg && o.max_memory > safe)
      return {o.max_memory,
              fmt::format("--max-memory {} leaves too little room under {}: the kernel may kill ddprund before it "
                          "refuses a request; give at most {}, or raise the limit",
                          o.max_memory, limit, safe),
              true};
    return {o.max_memory};
  }
  const uint64_t budget = std::min(o.max_memory, safe);
  if (budget >= least)
    return {budget,
            cg && budget < o.max_memory ? fmt::format("--max-memory {} bytes: room left under {}", budget, limit) : ""};
  if (cg && safe < least)
    return {least,
            fmt::format("{} leaves room for less than one request and one reply ({} bytes, the least --max-memory): "
                        "the kernel may kill ddprund before it refuses a request; raise the limit or lower "
                        "--max-request-bytes and --max-reply-bytes",
                        limit, least),
            true};
  return {least};
}

int run(const DaemonOptions& o) {
  spdlog::set_level(spdlog::level::from_str(o.log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%l] %v");
  ::mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  ::mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes);
  ddprun::server::raise_fd_limit();
  ddprun::server::StoreServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.legacy_dialect = o.legacy_dialect == "2.1" ? ddprun::wire::Dialect::D1 : ddprun::wire::Dialect::D0;
  so.limits.max_key_len = o.max_key_len;
  so.limits.max_value_len = o.max_value_len;
  so.limits.max_keys = o.max_keys;
  // A longer --max-value-len raises the request limit with it (it used to cap it silently).
  so.limits.max_request_bytes =
      o.max_request_bytes > 0 ? o.max_request_bytes
                              : std::max(so.limits.max_request_bytes, ddprun::server::min_request_bytes(so.limits));
  so.store.max_reply_bytes = o.reply_given ? o.max_reply_bytes : std::max(o.max_reply_bytes, o.max_value_len + 16);
  so.store.max_keys = o.max_store_keys;
  so.store.max_bytes = o.max_store_bytes;
  so.store.max_value_len = o.max_value_len;
  so.max_connections = o.max_connections;
  so.max_jobs = o.max_jobs;
  so.max_stranger_connections = o.max_stranger_connections;
  so.first_bytes_timeout = std::chrono::milliseconds(o.first_bytes_timeout_ms);
  so.handshake_timeout = std::chrono::milliseconds(o.handshake_timeout_ms);
  so.max_connection_buffered_bytes = o.conn_buffer_given
                                         ? o.max_connection_buffered_bytes
                                         : std::max(o.max_connection_buffered_bytes, so.store.max_reply_bytes);
  so.max_buffered_bytes =
      o.buffer_given ? o.max_buffered_bytes : std::max(o.max_buffered_bytes, so.limits.max_request_bytes);
  const MemoryChoice memory = resolve_max_memory(o, so.limits.max_request_bytes + so.store.max_reply_bytes);
  so.max_memory = memory.bytes;
  so.store.max_watches_per_connection = o.max_watches;
  so.io_threads = o.threads;
  so.standing = true;
  so.log_prefix = "[ddprund] ";
  so.collect_metrics = o.metrics_port.has_value();
  so.adaptive_lock = ddprun::knobs::get(ddprun::knobs::kStoreLock) != std::optional<std::string>("plain");
  try {
    so.rdzv_token = ddprun::rdzv::load_token(o.rdzv_token_file, std::getenv(ddprun::knobs::kRdzvToken.name));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ddprund: %s\n", e.what());
    return 2;
  }
  if (so.rdzv_token.empty() && o.allow_open_rendezvous == "no") {
    std::fprintf(stderr,
                 "ddprund: no rendezvous token, and --allow-open-rendezvous=no: give --rdzv-token-file=FILE (a "
                 "file of 16+ bytes, mode 0600, owned by the user ddprund runs as) or DDPRUN_RDZV_TOKEN, or pass "
                 "--allow-open-rendezvous=yes to let anyone who can connect join\n");
    return 2;
  }
  // With a token the rendezvous is closed to strangers; so is the plain store, unless asked.
  so.restrict_main_store = !so.rdzv_token.empty() && !o.store_from_any_address;

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ddprun::server::StoreServer server(so);
  try {
    server.start();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ddprund: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprund: %s. Choose another --port, or 0 for a free one.\n", e.what());
    return 1;
  }
  std::unique_ptr<ddprun::metrics::MetricsEndpoint> metrics;
  if (o.metrics_port) {
    auto source = std::make_shared<ddprun::metrics::FunctionCollectable>(
        [&server] { return ddprun::metrics::store_metric_families(server.metrics()); });
    try {
      metrics = ddprun::metrics::MetricsEndpoint::start(o.metrics_host, *o.metrics_port, source, "--metrics-");
    } catch (const ddprun::metrics::MetricsEndpointError& e) {
      std::fprintf(stderr, "ddprund: %s\n", e.what());
      server.stop();
      return 1;
    }
  }
  // Scripts read the port at the end of this first line, and the metrics URL at the end of the next.
  std::printf("ddprund listening on %s:%u\n", o.host.empty() ? "*" : o.host.c_str(), server.port());
  if (metrics) std::printf("ddprund metrics on %s\n", metrics->url().c_str());
  spdlog::info("[ddprund] {} I/O threads", server.io_threads());
  if (!memory.note.empty())
    spdlog::log(memory.warn ? spdlog::level::warn : spdlog::level::info, "[ddprund] {}", memory.note);
  if (so.rdzv_token.empty())
    spdlog::info("[ddprund] the rendezvous is open to anyone who can connect: set --rdzv_token_file or "
                 "DDPRUN_RDZV_TOKEN (the same on every agent) to require a token");
  else
    spdlog::info("[ddprund] agents must prove the rendezvous token before they join; the main store serves "
                 "TCPStore clients {}",
                 so.restrict_main_store ? "from loopback and the hosts of admitted agents only"
                                        : "from any address (--store-from-any-address)");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  auto st = server.stats();
  spdlog::info("[ddprund] signal {}: stopping ({} connections accepted, {} requests, {} closed for bad input)", sig,
               st.connections_accepted, st.requests, st.connections_closed_for_bad_input);
  // What held a state lock longest, and the runner-up operations (scripts read the first number).
  std::string others;
  for (size_t i = 1; i < st.lock_holds.size() && i < 4; ++i)
    others += fmt::format("{}{} {:.1f} ms", i == 1 ? "; then " : ", ", st.lock_holds[i].site,
                          st.lock_holds[i].longest_us / 1000.0);
  spdlog::info("[ddprund] longest lock hold {:.1f} ms ({}{})", st.longest_lock_hold_us / 1000.0,
               st.longest_lock_holder.empty() ? "none" : st.longest_lock_holder, others);
  metrics.reset();  // its scrapes read the server
  server.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app;
  DaemonOptions opts;
  setup_options(app, opts);
  try {
    app.parse(argc, argv);
    opts.reply_given = app.count("--max-reply-bytes") > 0;
    opts.conn_buffer_given = app.count("--max-connection-buffered-bytes") > 0;
    opts.buffer_given = app.count("--max-buffered-bytes") > 0;
    opts.memory_given = app.count("--max-memory") > 0;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return run(opts);
}
