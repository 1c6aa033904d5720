// Small system-call helpers of the agent's event loop (internal to launcher/src): timers,
// descriptor passing.
#pragma once

#include <sys/socket.h>
#include <sys/timerfd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "ddprun/common/check.h"  // DDPRUN_CHECK_SYS

namespace ddprun::launcher {

// Arms `fd` (a timerfd) to expire once in `seconds` (with `repeat`, every `seconds` from then
// on); 0 disarms. A tiny positive value still fires (at once).
inline void arm_timerfd(int fd, double seconds, bool repeat = false) {
  itimerspec spec{};
  if (seconds > 0) {
    auto ns = static_cast<long long>(seconds * 1e9);
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000LL);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000LL);
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
    if (repeat) spec.it_interval = spec.it_value;
  }
  DDPRUN_CHECK_SYS(::timerfd_settime(fd, 0, &spec, nullptr));
}

// sendmsg of `len` bytes of `data` with up to 2 descriptors attached (SCM_RIGHTS), retried
// on EINTR, never raising SIGPIPE. Returns what sendmsg returned. Async-signal-safe (the
// exit watch calls it in a forked child).
inline ssize_t send_with_fds(int sock, const void* data, size_t len, const int* fds, size_t nfds) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (nfds > 0) {
    if (nfds > 2) nfds = 2;
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

}  // namespace ddprun::launcher
