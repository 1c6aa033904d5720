// The value parsers' shared pieces (internal to options/): trimming, splitting, numbers,
// booleans, and the one-line usage error that names the flag.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher::opt {

std::string trim(const std::string& s);
std::vector<std::string> split(const std::string& s, char sep);
[[noreturn]] void bad(const std::string& flag, const std::string& value, const std::string& expected);
std::optional<long long> to_int(const std::string& s);
int int_in(const std::string& flag, const std::string& value, long long lo, long long hi,
           const std::string& expected);
double seconds(const std::string& flag, const std::string& value);
// A PET_ value of a flag that takes none: 1/true/yes/on or 0/false/no/off/"".
bool truthy(const std::string& flag, const std::string& value);
// A boolean flag that takes a value: 1/0 or true/false (any case).
bool boolean(const std::string& flag, const std::string& value);

}  // namespace ddprun::launcher::opt
