#include "ddprun/worker/checks.h"

#include <cstring>
#include <system_error>

namespace ddprun::worker::detail {

void throw_errno(const char* expr, const char* file, int line, int err) {
  throw std::system_error(err, std::generic_category(),
                          std::string(file) + ":" + std::to_string(line) + ": " + expr);
}

void throw_enforce(const char* cond, const char* file, int line, const std::string& msg) {
  throw std::logic_error(std::string(file) + ":" + std::to_string(line) + ": invariant `" + cond +
                         "` failed: " + msg);
}

}  // namespace ddprun::worker::detail
