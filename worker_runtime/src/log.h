// The runtime's own logger: "ddprun_worker", to stderr, so that its warnings and errors reach
// the launcher's view of the worker's stderr (ddprun's failure summary shows its tail) and not
// the program's stdout. It is registered with spdlog, so spdlog::set_level and the program's
// other spdlog settings apply to it; a program that registered a logger of that name first
// gets its own used instead.
#pragma once

#include <spdlog/spdlog.h>

namespace ddprun::worker::detail {

spdlog::logger& log();

}  // namespace ddprun::worker::detail
