// Every flag of ddprun, once (internal to options/): its canonical name (torchrun's dest),
// short alias, whether it takes a value, and its help. The dashed spelling and PET_<NAME>
// are derived from the name.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace ddprun::launcher::opt {

struct FlagSpec {
  const char* name;
  const char* short_name;  // "" when none
  bool takes_value;
  const char* help;
};

std::span<const FlagSpec> all_flags();
const FlagSpec* find_flag(const std::string& name);
std::string env_name(const std::string& name);  // PET_<NAME>
// Refuses an empty `--flag=` (UsageError naming it), up to the entry point; the duplicate
// filters' empty value is passed on as an explicit "" (it means every line).
void check_empty_values(std::vector<std::string>& args);

}  // namespace ddprun::launcher::opt
