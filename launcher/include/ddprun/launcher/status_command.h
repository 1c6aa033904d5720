// `ddprun status`: the running jobs of this user on this host, read from each agent's
// owner-only socket (launcher/README.md, "ddprun status").
#pragma once

#include <string>
#include <vector>

#include "ddprun/launcher/env_map.h"

namespace ddprun::launcher {

// args: what follows `ddprun status`. Prints the table (or --json) on stdout; with --watch
// redraws it every --interval seconds until interrupted. Returns 0 when an agent answered,
// 1 when none runs (stderr says how to start one), 2 for a bad command line.
int run_status(const std::vector<std::string>& args, const EnvMap& env);

}  // namespace ddprun::launcher
