// Connecting and reconnecting to the rendezvous server (reconnector.h).
#include "coordination/reconnector.h"

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <system_error>

#include "ddprun/launcher/coordinator.h"
#include "platform/sys_util.h"

namespace ddprun::launcher {

using Clock = std::chrono::steady_clock;

std::unique_ptr<rdzv::RendezvousClient> connect_rendezvous(const RendezvousEndpoint& e,
                                                           std::chrono::milliseconds timeout) {
  try {
    auto c = std::make_unique<rdzv::RendezvousClient>(e.host, e.port, timeout, e.heartbeat_interval, e.interrupted,
                                                      e.token);
    if (e.status_source) c->set_heartbeat_status(e.status_source);
    return c;
  } catch (const rdzv::RendezvousInterrupted& x) {
    throw CoordinatorInterrupted(x.what());
  } catch (const rdzv::RendezvousError& x) {
    throw CoordinatorError(x.what());
  }
}

Reconnector::Reconnector(RendezvousEndpoint endpoint, int epfd) : endpoint_(std::move(endpoint)) {
  timer_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_ < 0) throw std::system_error(errno, std::generic_category(), "timerfd_create");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = timer_;
  if (::epoll_ctl(epfd, EPOLL_CTL_ADD, timer_, &ev) != 0) {
    const int e = errno;
    ::close(timer_);
    throw std::system_error(e, std::generic_category(), "epoll_ctl");
  }
}

Reconnector::~Reconnector() { ::close(timer_); }

void Reconnector::start(const std::string& why, std::chrono::milliseconds budget) {
  active_ = true;
  lost_why_ = why;
  budget_ = budget;
  t0_ = Clock::now();
  deadline_ = t0_ + budget;
  backoff_ = std::chrono::milliseconds(50);
  arm(std::chrono::milliseconds(0));
}

double Reconnector::seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

void Reconnector::arm(std::chrono::milliseconds after) {
  arm_timerfd(timer_, std::max(1e-9, std::chrono::duration<double>(after).count()));
}

std::unique_ptr<rdzv::RendezvousClient> Reconnector::attempt() {
  uint64_t expirations = 0;
  if (!active_ || ::read(timer_, &expirations, sizeof expirations) <= 0) return nullptr;  // not due
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  std::string failed;
  try {
    if (left.count() <= 0) throw rdzv::RendezvousError("no time left");
    auto client = connect_within_budget(std::min(left, kAttempt));
    active_ = false;
    return client;
  } catch (const rdzv::RendezvousError& e) {
    // A daemon still dying (its backlog accepts, then resets) or not listening yet: again.
    // A refusal too (an ERROR, a wrong or replayed proof): nothing there proved the token,
    // so it is not the server yet (anyone may answer on its port while it is down), and only
    // the authenticated server can end the job. The deadline's error names the last one.
    failed = e.what();
  }
  if (Clock::now() + backoff_ >= deadline_)
    throw CoordinatorError("lost the standing rendezvous server at " + endpoint_.where() + " (" + lost_why_ +
                           ") and it did not come back within " + std::to_string(budget_.count() / 1000) +
                           " s (last attempt: " + failed + "); the job's rounds lived there");
  arm(backoff_);
  backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
  return nullptr;
}

// A client connected within `connect_timeout`, whose handshake gives up once the reconnect
// deadline passes (the client asks its interrupted callback every 100 ms while it waits for
// the server's answers). Throws rdzv::RendezvousError, or CoordinatorInterrupted for a stop.
std::unique_ptr<rdzv::RendezvousClient> Reconnector::connect_within_budget(std::chrono::milliseconds connect_timeout) {
  // Only while connecting: afterwards the client asks it before its sends, which the
  // deadline has nothing to do with.
  auto connecting = std::make_shared<std::atomic<bool>>(true);
  auto budget_spent = std::make_shared<std::atomic<bool>>(false);
  auto interrupted = [user = endpoint_.interrupted, connecting, budget_spent, deadline = deadline_] {
    if (user && user()) return true;
    if (!*connecting || Clock::now() < deadline) return false;
    *budget_spent = true;
    return true;
  };
  try {
    auto c = std::make_unique<rdzv::RendezvousClient>(endpoint_.host, endpoint_.port, connect_timeout,
                                                      endpoint_.heartbeat_interval, interrupted, endpoint_.token);
    if (endpoint_.status_source) c->set_heartbeat_status(endpoint_.status_source);
    *connecting = false;
    return c;
  } catch (const rdzv::RendezvousInterrupted& e) {
    if (!*budget_spent) throw CoordinatorInterrupted(e.what());
    throw rdzv::RendezvousError("no answer to the handshake before the reconnect time ran out");
  }
}

}  // namespace ddprun::launcher
