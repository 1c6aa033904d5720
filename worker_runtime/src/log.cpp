#include "log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace ddprun::worker::detail {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    constexpr const char* kName = "ddprun_worker";
    if (auto existing = spdlog::get(kName)) return existing;
    try {
      auto made = spdlog::stderr_color_mt(kName);
      made->set_level(spdlog::get_level());
      return made;
    } catch (const spdlog::spdlog_ex&) {  // registered by another thread meanwhile
      return spdlog::get(kName);
    }
  }();
  return *logger;
}

}  // namespace ddprun::worker::detail
