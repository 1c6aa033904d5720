// ddprun_store_relay: a store relay (relay/store_relay.h) in front of a given store, for tests
// and for trying one by hand. Prints "store relay listening on 127.0.0.1:PORT", then relays
// until SIGINT or SIGTERM.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "ddprun/relay/store_relay.h"

int main(int argc, char** argv) {
  CLI::App app{"A store relay: TCPStore clients on 127.0.0.1 reach the store over one connection."};
  std::string upstream;
  bool verbose = false;
  app.add_option("--upstream", upstream, "The store, HOST:PORT")->required();
  app.add_flag("-v,--verbose", verbose, "Debug logging");
  CLI11_PARSE(app, argc, argv);
  const auto colon = upstream.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    try {
      port = std::stoi(upstream.substr(colon + 1));
    } catch (const std::exception&) {
    }
  }
  if (colon == std::string::npos || colon == 0 || port <= 0 || port > 65535) {
    std::fprintf(stderr,
                 "ddprun_store_relay: --upstream %s is not HOST:PORT; give the store's address, e.g. 10.0.0.1:29500\n",
                 upstream.c_str());
    return 2;
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("store_relay"));  // stdout carries the port
  if (verbose) spdlog::set_level(spdlog::level::debug);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  ddprun::relay::StoreRelay relay(
      {.upstream_host = upstream.substr(0, colon), .upstream_port = static_cast<uint16_t>(port)});
  try {
    std::printf("store relay listening on 127.0.0.1:%u\n", relay.start());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun_store_relay: %s\n", e.what());
    return 1;
  }
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  const auto st = relay.stats();
  spdlog::info("store relay: stopping ({} connections relayed, {} refused, {} dropped for not reading)", st.accepted,
               st.refused, st.dropped_slow);
  relay.stop();
  return 0;
}
