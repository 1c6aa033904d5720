#include "coordination/store_hosting.h"

#include <spdlog/spdlog.h>

#include <atomic>

namespace ddprun::launcher {

std::unique_ptr<server::StoreServer> host_store(const StoreHosting& h) {
  // At the default soft limit of 1024 a few hundred strangers used to exhaust the
  // descriptors: take the hard limit, as ddprund does.
  server::raise_fd_limit();
  server::StoreServerOptions so;
  so.host = h.listen_host;
  so.port = h.port;
  so.io_threads = h.io_threads;
  so.enable_rendezvous = h.serve_rendezvous;
  so.rdzv_token = h.rdzv_token;
  so.rdzv_munge = h.rdzv_munge;
  so.restrict_main_store = h.restrict_main_store;
  so.accept_later = h.accept_later;
  // The job's console is the workers' output: a stranger's bad bytes or connection flood may
  // put one line there (so the operator knows), the rest go to the -v log.
  so.peer_warning = [shown = std::make_shared<std::atomic<bool>>(false)](const std::string& line) {
    if (!shown->exchange(true))
      spdlog::warn("{} (more warnings about peers of this store only with -v)", line);
    else
      spdlog::debug("{}", line);
  };
  auto s = std::make_unique<server::StoreServer>(so);
  if (h.store_peers) s->set_store_peers(*h.store_peers);
  s->start();
  return s;
}

}  // namespace ddprun::launcher
