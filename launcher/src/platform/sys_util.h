// Small system-call helpers of the agent's event loop (internal to launcher/src).
#pragma once

#include <sys/timerfd.h>

#include <cerrno>
#include <string>
#include <system_error>

#include "ddprun/common/check.h"  // DDPRUN_CHECK_SYS

namespace ddprun::launcher {

// Arms `fd` (a timerfd) to expire once in `seconds`; 0 disarms. A tiny positive value still
// fires (at once).
inline void arm_timerfd(int fd, double seconds) {
  itimerspec spec{};
  if (seconds > 0) {
    auto ns = static_cast<long long>(seconds * 1e9);
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000LL);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000LL);
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  }
  DDPRUN_CHECK_SYS(::timerfd_settime(fd, 0, &spec, nullptr));
}

}  // namespace ddprun::launcher
