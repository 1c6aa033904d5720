// One check macro for the launcher and rendezvous side: every system call checked at its call
// site, failing with file:line, the expression and strerror. (The worker runtime's public
// ddprun/worker/checks.h has its own, typed for its error policy.)
#pragma once

#include <cerrno>
#include <string>
#include <system_error>

namespace ddprun::detail {
[[noreturn]] inline void throw_sys(const char* expr, const char* file, int line, int err) {
  throw std::system_error(err, std::generic_category(),
                          std::string(expr) + " at " + file + ":" + std::to_string(line));
}
}  // namespace ddprun::detail

// For calls that return a negative value and set errno on failure.
#define DDPRUN_CHECK_SYS(expr)                                                \
  do {                                                                        \
    if ((expr) < 0) ::ddprun::detail::throw_sys(#expr, __FILE__, __LINE__, errno); \
  } while (0)
