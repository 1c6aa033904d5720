// ddprun's own log lines, text or JSON (--log_format): the "ddprun" spdlog logger, the event a
// line stands for, and lines written outside spdlog. The JSON line itself is log_format.h.
//
//   LogEvent ev("worker_failed", {{"exit_code", int64_t{1}}}, global_rank);
//   spdlog::warn("worker r{} failed: ...", ...);   // this line carries the event
//
// In text mode the event changes nothing. A LogEvent covers the next line its thread logs.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "ddprun/launcher/log_format.h"

namespace ddprun::launcher {

class LogEvent {
 public:
  explicit LogEvent(std::string_view event, std::vector<LogField> fields = {}, std::optional<int> rank = {});
  ~LogEvent();
  LogEvent(const LogEvent&) = delete;
  LogEvent& operator=(const LogEvent&) = delete;
};

// Installs the "ddprun" logger on stderr as the default one: "[ddprun] level: message" or JSON
// lines; debug lines with verbosity > 0. `timestamps` (--log_timestamps): each text line begins
// with the local time (JSON lines always carry theirs).
void configure_logging(LogFormat format, int verbosity, bool timestamps = false);
LogFormat log_format();
// The node rank the rendezvous gave this agent (JSON lines carry it from then on).
void set_log_node_rank(std::optional<int> node_rank);

// A line outside the logger (before it exists, or a block such as the summary): `text` as it is
// in text mode, else one JSON line of `level`, `event`, `message` and `fields`. Flushed.
void write_log_line(std::string_view level, std::string_view event, std::string_view text, std::string_view message,
                    const std::vector<LogField>& fields = {});

}  // namespace ddprun::launcher
