// An environment as a map (name -> value): what the launcher reads its knobs, PET_ flags,
// Slurm's and the GPUs' variables from, and what each worker gets. Platform layer.
#pragma once

#include <map>
#include <string>

namespace ddprun::launcher {

using EnvMap = std::map<std::string, std::string>;

}  // namespace ddprun::launcher
