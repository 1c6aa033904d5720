#include "ddprun/client/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ddprun/client/tcp_connect.h"

namespace ddprun::client {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
// Every address of this host's interfaces, in numeric form, with its interface's name.
std::vector<std::pair<std::string, std::string>> interface_addresses() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = "";
    if (i->ifa_addr->sa_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
    else if (i->ifa_addr->sa_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, buf, sizeof buf);
    if (*buf) out.emplace_back(buf, i->ifa_name);
  }
  ::freeifaddrs(list);
  return out;
}
}  // namespace

std::string interface_of(const std::string& addr) {
  for (const auto& [a, name] : interface_addresses())
    if (a == addr) return name;
  return "";
}

std::vector<std::string> local_addresses() {
  std::vector<std::string> out;
  for (auto& [a, name] : interface_addresses()) out.push_back(std::move(a));
  return out;
}

std::string local_address_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], buf, sizeof buf);
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
    }
  }
  return buf;
}

namespace {

constexpr milliseconds kSlice{100};  // how often `interrupted` is asked, at most this far apart
constexpr milliseconds kResolveAttempt{5000};

// Waits until `deadline` in slices; false when interrupted.
bool pause_until(Clock::time_point until, const std::function<bool()>& interrupted) {
  while (true) {
    if (interrupted && interrupted()) return false;
    const auto now = Clock::now();
    if (now >= until) return true;
    ::poll(nullptr, 0, static_cast<int>(std::min(kSlice, std::chrono::ceil<milliseconds>(until - now)).count()));
  }
}

// getaddrinfo cannot be abandoned (a name whose DNS server does not answer holds it for the
// resolver's whole timeout), so it runs on a detached thread; the caller waits in slices and,
// when stopped or out of time, walks away. The shared state outlives whichever side is last.
struct Resolution {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int rc = 0;
  addrinfo* res = nullptr;
  bool abandoned = false;
};

enum class ResolveOutcome { Resolved, Failed, TimedOut, Interrupted };

ResolveOutcome resolve_until(const std::string& host, uint16_t port, Clock::time_point deadline,
                             const std::function<bool()>& interrupted, addrinfo*& res, std::string& error) {
  auto r = std::make_shared<Resolution>();
  try {
    std::thread([r, host, service = std::to_string(port)] {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* out = nullptr;
      const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &out);
      std::lock_guard lk(r->mu);
      if (r->abandoned) {
        if (rc == 0) ::freeaddrinfo(out);
        return;
      }
      r->rc = rc;
      r->res = out;
      r->done = true;
      r->cv.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    error = "cannot resolve '" + host + "': " + e.what();
    return ResolveOutcome::Failed;
  }
  std::unique_lock lk(r->mu);
  while (!r->cv.wait_for(lk, std::min(kSlice, std::chrono::ceil<milliseconds>(deadline - Clock::now())),
                         [&] { return r->done; })) {
    // `interrupted` is the caller's (it may read a signalfd): asked without our lock.
    lk.unlock();
    const bool stop = interrupted && interrupted();
    lk.lock();
    if (r->done) break;
    if (stop || Clock::now() >= deadline) {
      r->abandoned = true;
      error = "cannot resolve '" + host + "': no answer from the name service";
      return stop ? ResolveOutcome::Interrupted : ResolveOutcome::TimedOut;
    }
  }
  if (r->rc != 0) {
    error = "cannot resolve '" + host + "': " + gai_strerror(r->rc);
    return ResolveOutcome::Failed;
  }
  res = r->res;
  return ResolveOutcome::Resolved;
}

// One non-blocking connect to one address. Returns the fd, or -1 (`error` set); `interrupted`
// sets `stop`.
int try_address(const addrinfo* ai, const std::string& where, Clock::time_point deadline,
                const std::function<bool()>& interrupted, bool& stop, std::string& error) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) {
    error = "socket: " + std::string(std::strerror(errno));
    return -1;
  }
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  int err = rc == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    err = ETIMEDOUT;
    while (true) {
      if (interrupted && interrupted()) {
        stop = true;
        break;
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      pollfd p{fd, POLLOUT, 0};
      const auto wait = std::min(kSlice, std::chrono::ceil<milliseconds>(deadline - now));
      if (::poll(&p, 1, static_cast<int>(wait.count())) > 0) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        break;
      }
    }
  }
  if (err == 0 && connected_to_itself(fd)) {
    // Nothing listens on a local ephemeral port that the kernel also chose as our source.
    error = "connect to " + where + ": nothing listens there yet (self-connect)";
  } else if (err == 0) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  } else {
    error = "connect to " + where + ": " + std::strerror(err);
  }
  ::close(fd);
  return -1;
}

}  // namespace

bool is_local_address(const std::string& host) {
  if (host == "localhost") return true;
  // Bounded like the connect's lookups: a name service that does not answer means "not ours".
  addrinfo* res = nullptr;
  std::string error;
  if (resolve_until(host, 0, Clock::now() + kResolveAttempt, {}, res, error) != ResolveOutcome::Resolved) return false;
  bool local = false;
  for (addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;  // port 0 in the result: no conflict
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return local;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

std::vector<std::string> resolve_all(const std::string& host) {
  std::vector<std::string> out;
  addrinfo* res = nullptr;
  std::string error;
  if (host.empty() ||
      resolve_until(host, 0, Clock::now() + kResolveAttempt, {}, res, error) != ResolveOutcome::Resolved)
    return out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    char buf[INET6_ADDRSTRLEN] = "";
    if (ai->ai_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, buf, sizeof buf);
    else if (ai->ai_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, buf, sizeof buf);
    if (*buf && std::find(out.begin(), out.end(), buf) == out.end()) out.emplace_back(buf);
  }
  ::freeaddrinfo(res);
  return out;
}

int connect_until(const std::string& host, uint16_t port, Clock::time_point deadline,
                  const std::function<bool()>& interrupted, ConnectOutcome& outcome, std::string& error) {
  const std::string where = host + ":" + std::to_string(port);
  auto backoff = milliseconds(20);
  while (true) {
    addrinfo* res = nullptr;
    // Each attempt's lookup gets at most a few seconds, so a slow name service is retried
    // (and reported) like a refused connect instead of using up the whole deadline at once.
    const auto resolved =
        resolve_until(host, port, std::min(deadline, Clock::now() + kResolveAttempt), interrupted, res, error);
    if (resolved == ResolveOutcome::Interrupted) {
      outcome = ConnectOutcome::Interrupted;
      return -1;
    }
    if (resolved == ResolveOutcome::Resolved) {
      bool stop = false;
      for (addrinfo* ai = res; ai && !stop; ai = ai->ai_next) {
        int fd = try_address(ai, where, deadline, interrupted, stop, error);
        if (fd >= 0) {
          ::freeaddrinfo(res);
          outcome = ConnectOutcome::Connected;
          return fd;
        }
      }
      ::freeaddrinfo(res);
      if (stop) {
        outcome = ConnectOutcome::Interrupted;
        return -1;
      }
    }
    if (Clock::now() + backoff >= deadline) {
      outcome = ConnectOutcome::TimedOut;
      return -1;
    }
    if (!pause_until(Clock::now() + backoff, interrupted)) {
      outcome = ConnectOutcome::Interrupted;
      return -1;
    }
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

}  // namespace ddprun::client
