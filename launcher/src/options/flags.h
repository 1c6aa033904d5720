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
// The flags whose empty value torchrun 2.11 takes and runs with (what "" means for each:
// options.cpp). Every other flag's empty value is a usage error.
bool empty_value_allowed(const std::string& name);
// Up to the entry point: an empty `--flag=` of empty_value_allowed is passed on as an explicit
// "" (CLI11 would take the next argument as its value); any other is refused (UsageError
// naming it).
void check_empty_values(std::vector<std::string>& args);

}  // namespace ddprun::launcher::opt
