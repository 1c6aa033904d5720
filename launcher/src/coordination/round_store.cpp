// The workers' store offered to, and hosted for, a standing rendezvous server (round_store.h).
#include "coordination/round_store.h"

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>
#include <vector>

#include <spdlog/spdlog.h>

#include "coordination/store_hosting.h"
#include "ddprun/launcher/coordinator.h"
#include "ddprun/rdzv/fixed_port_stores.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {

RoundStoreHost::RoundStoreHost(int epfd) : epfd_(epfd) {
  timer_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_ < 0) throw std::system_error(errno, std::generic_category(), "timerfd_create");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = timer_;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, timer_, &ev) != 0) {
    const int e = errno;
    ::close(timer_);
    throw std::system_error(e, std::generic_category(), "epoll_ctl");
  }
}

RoundStoreHost::~RoundStoreHost() {
  store_.reset();
  ::close(timer_);
}

uint16_t RoundStoreHost::offer() {
  drop();
  try {
    StoreHosting h;
    h.listen_host = "";  // every address: the workers of every node reach it at this node's
    h.io_threads = 0;    // the whole job's workers may connect to it
    h.restrict_main_store = true;
    h.accept_later = true;  // a worker that comes before the round's peers are known retries
    store_ = host_store(h);
    return store_->port();
  } catch (const std::exception& e) {
    spdlog::warn("cannot open a workers' store on this node ({}); the rendezvous server keeps it", e.what());
    return 0;
  }
}

void RoundStoreHost::drop() {
  stop_hosting();
  store_.reset();
}

void RoundStoreHost::on_round(const rdzv::Round& r) {
  const bool ours = !r.store_host.empty() && r.node_rank == 0;
  if (!ours || !store_) {
    store_.reset();
    if (ours) throw CoordinatorError("the rendezvous server made this node host the workers' store of round " +
                                     std::to_string(r.round) + ", but it offered none");
    return;
  }
  if (r.store_port != store_->port())
    throw CoordinatorError("the rendezvous server named port " + std::to_string(r.store_port) +
                           " for this node's workers' store, which is on port " + std::to_string(store_->port()));
  std::vector<std::string> peers;
  for (size_t i = 0; i <= r.store_peers.size();) {
    const size_t j = std::min(r.store_peers.find(',', i), r.store_peers.size());
    if (j > i) peers.push_back(r.store_peers.substr(i, j - i));
    i = j + 1;
  }
  for (const auto& name : store_->set_store_peers(peers))
    spdlog::debug("workers' store: {} is no IP address; its clients come through another address", name);
  try {
    store_->accept_clients();
  } catch (const std::exception& e) {
    throw CoordinatorError(std::string("cannot serve the workers' store of round ") + std::to_string(r.round) + ": " +
                           e.what());
  }
  hosting_ = true;
  progress_sent_ = false;
  world_size_ = r.world_size;
  set_poll(true);
  spdlog::info("this node hosts the workers' store of round {} on port {} ({} workers)", r.round, r.store_port,
               r.world_size);
}

void RoundStoreHost::stop_hosting() {
  if (!hosting_) return;
  hosting_ = false;
  set_poll(false);
}

// Once every worker joined the store (the progress rule of fixed_port_stores.h).
bool RoundStoreHost::take_progress() {
  uint64_t expirations = 0;
  while (::read(timer_, &expirations, sizeof expirations) > 0) {
  }
  if (!hosting_ || progress_sent_ || !store_) return false;
  const int64_t joined = store_->counter(rdzv::kWorkerJoinKey);
  if (!rdzv::all_workers_joined(joined < 0 ? std::nullopt : std::optional<int64_t>(joined), world_size_)) return false;
  progress_sent_ = true;
  set_poll(false);
  return true;
}

void RoundStoreHost::set_poll(bool on) {
  arm_timerfd(timer_, on ? std::chrono::duration<double>(kProgressPoll).count() : 0, /*repeat=*/true);
}

}  // namespace ddprun::launcher
