// ddprund: a standing TCPStore-compatible store daemon (PyTorch 1.13 .. 2.11 clients).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "ddprun/server/store_server.h"

namespace {

struct DaemonOptions {
  std::string host;
  uint16_t port = 29400;
  std::string legacy_dialect = "1.13";
  std::string log_level = "info";
  int threads = 0;
  uint64_t max_key_len = ddprun::wire::Limits{}.max_key_len;
  uint64_t max_value_len = ddprun::wire::Limits{}.max_value_len;
};

void setup_options(CLI::App& app, DaemonOptions& o) {
  app.description("ddprund: a TCP store that speaks PyTorch's TCPStore protocol (1.13 to 2.11).");
  app.add_option("--host", o.host, "address to listen on (default: every address, IPv6 and IPv4)");
  app.add_option("-p,--port", o.port, "TCP port; 0 picks a free one (printed on start)")->capture_default_str();
  app.add_option("--legacy-dialect", o.legacy_dialect,
                 "meaning of codes 7/8 for clients that send no VALIDATE: 1.13 (also 2.0) or 2.1")
      ->check(CLI::IsMember({"1.13", "2.0", "2.1"}))
      ->capture_default_str();
  app.add_option("--max-key-len", o.max_key_len, "longest key accepted, bytes")->capture_default_str();
  app.add_option("--max-value-len", o.max_value_len, "longest value accepted, bytes")->capture_default_str();
  app.add_option("--threads", o.threads,
                 "I/O threads; 0 = one per core, at most " + std::to_string(ddprun::server::kMaxAutoIoThreads))
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

// Thousands of clients need thousands of descriptors: take the hard limit.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

int run(const DaemonOptions& o) {
  spdlog::set_level(spdlog::level::from_str(o.log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%l] %v");
  raise_fd_limit();
  ddprun::server::StoreServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.legacy_dialect = o.legacy_dialect == "2.1" ? ddprun::wire::Dialect::D1 : ddprun::wire::Dialect::D0;
  so.limits.max_key_len = o.max_key_len;
  so.limits.max_value_len = o.max_value_len;
  so.io_threads = o.threads;

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ddprun::server::StoreServer server(so);
  try {
    server.start();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprund: %s. Choose another --port, or 0 for a free one.\n", e.what());
    return 1;
  }
  // Scripts read the port at the end of this first line.
  std::printf("ddprund listening on %s:%u\n", o.host.empty() ? "*" : o.host.c_str(), server.port());
  spdlog::info("[ddprund] {} I/O threads", server.io_threads());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  auto st = server.stats();
  spdlog::info("[ddprund] signal {}: stopping ({} connections accepted, {} requests, {} closed for bad input)", sig,
               st.connections_accepted, st.requests, st.connections_closed_for_bad_input);
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
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return run(opts);
}
