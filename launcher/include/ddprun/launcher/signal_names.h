// Signal numbers <-> names ("SIGSEGV"), for flags, summaries and logs. Pure.
#pragma once

#include <optional>
#include <string>

namespace ddprun::launcher {

// "SIGSEGV" for 11; "signal 99" for numbers without a name.
std::string signal_name(int signo);
// Accepts "SIGTERM", "TERM", "sigterm" or a number ("15"). nullopt when unknown.
std::optional<int> signal_from_name(const std::string& name);

}  // namespace ddprun::launcher
